"""A router replica that dies mid-request, as HTTP clients see it: 503, or an SSE error event.

Ray Serve's HTTP proxy passes on what the replica sends (`HttpApi` answers every failure of
its own with an OpenAI error object, a stream with an error event). When the replica itself
dies, the proxy sends nothing more (ray/serve/_private/proxy.py: `send_request_to_replica`
answers only timeouts, back-pressure and unavailable deployments itself), so uvicorn answers
a request not yet answered with a bare 500, and a stream that had begun is cut: no error
event, no `data: [DONE]`. The request did not fail because of its input, and Serve starts a
new replica: it is UNAVAILABLE.

`ReplicaLossMiddleware` wraps Serve's HTTP proxy app (installed by `actors.serve_proxy`) and
finishes such a response as the router would have: 503 with OpenAI's error object
(`service_unavailable_error`), or, for a started server-sent-event stream, one error event
like `HttpApi`'s own. A client that went away gets nothing; a JSON body cut mid-way (never
sent in parts by `HttpApi`) is left as it is.
"""

from __future__ import annotations

import json
from typing import Any

from specdec.serving.serving_errors import ErrorKind
from specdec_http.openai_responses import error_body, sse

MESSAGE = "the router replica serving this request died (Serve is starting a new one); retry"

Scope = dict[str, Any]
Message = dict[str, Any]


class _Response:
    """What went out on one request: started? finished? an event stream? did the client leave?"""

    def __init__(self) -> None:
        self.started = self.finished = self.event_stream = self.client_gone = False

    def sent(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = {bytes(k).lower(): bytes(v) for k, v in message.get("headers", [])}
            self.event_stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True

    def received(self, message: Message) -> None:
        if message["type"] == "http.disconnect":
            self.client_gone = True


class ReplicaLossMiddleware:
    """Pure ASGI middleware: a response Serve's proxy left unfinished is finished as UNAVAILABLE."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = _Response()

        async def watched_receive() -> Message:
            message = await receive()
            response.received(message)
            return message

        async def watched_send(message: Message) -> None:
            response.sent(message)
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        except Exception:
            await _finish(response, send)
            raise
        await _finish(response, send)


async def _finish(response: _Response, send: Any) -> None:
    """Answer 503, or end a started event stream with an error event, unless already done."""
    if response.finished or response.client_gone:
        return
    status, body = error_body(ErrorKind.UNAVAILABLE, MESSAGE)
    if not response.started:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})
    elif response.event_stream:
        await send({"type": "http.response.body", "body": sse(body).encode()})
