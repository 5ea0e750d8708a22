"""A router replica that dies mid-request behind Serve's HTTP proxy: the middleware answers
503 with OpenAI's error object when nothing was sent, ends a started event stream with an
error event, and leaves finished responses and departed clients alone."""

import asyncio
import json

from specdec_http.replica_loss import ReplicaLossMiddleware


def run(sends, client_leaves=False, raises=False):
    """Messages the client gets when the proxy app sends `sends` and then stops."""
    async def proxy(scope, receive, send):
        if client_leaves:
            await receive()
        for message in sends:
            await send(message)
        if raises:
            raise RuntimeError("the proxy failed")

    sent = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def main():
        try:
            await ReplicaLossMiddleware(proxy)({"type": "http"}, receive, send)
        except RuntimeError:
            assert raises

    asyncio.run(main())
    return sent


def start(content_type):
    return {"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]}


def test_a_request_not_answered_gets_503_with_openais_error_object():
    for raises in (False, True):
        start_message, body = run([], raises=raises)
        assert start_message["status"] == 503 and (b"retry-after", b"1") in start_message["headers"]
        error = json.loads(body["body"])["error"]
        assert error["type"] == "service_unavailable_error" and "router replica" in error["message"]


def test_a_cut_event_stream_ends_with_an_error_event():
    chunk = {"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True}
    sent = run([start(b"text/event-stream; charset=utf-8"), chunk])
    assert sent[:2] == [start(b"text/event-stream; charset=utf-8"), chunk]
    event = sent[2]["body"].decode()
    assert event.startswith("data: ") and event.endswith("\n\n") and not sent[2].get("more_body")
    assert json.loads(event[len("data: "):])["error"]["code"] == "unavailable"


def test_finished_responses_and_departed_clients_are_left_alone():
    done = [start(b"application/json"), {"type": "http.response.body", "body": b"{}"}]
    assert run(done) == done
    cut = [start(b"text/event-stream"), {"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True}]
    assert run(cut, client_leaves=True) == cut
    assert run([], client_leaves=True) == []
