"""The OpenAI-compatible HTTP API on in-process models, served by uvicorn on 127.0.0.1 and
called with the official `openai` client (no Ray: the same routes Serve's HTTP proxy runs).

Completions and chat, unary and streaming (one event per round, `data: [DONE]` last);
greedy output equals transformers' generate of the target; seeded sampling reproduces;
400 names the field, 404 for unknown routes, 429 past the admission limit, 503 while not
ready, 504 past the request's deadline; a client that disconnects frees its slots.
"""

from __future__ import annotations

import json

import openai
import pytest

from specdec.wiring.ports import free_port
from openai_http import OpenStream, OpenUnary, UvicornThread, get, post, post_raw, sse_lines, wait_until
from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_served_engine
from specdec.serving.frontend import Frontend
from specdec_http.http_api import HttpApi, asgi_app

NUM_SLOTS = 4
MAX_CONCURRENT = 2
MODEL = "bundled:target"
STREAMS_OBSERVED: list[tuple[float | None, list[tuple[float, int]]]] = []  # what the metrics would get


@pytest.fixture(scope="module")
def served():
    served = build_served_engine(load_config(overrides={
        "cache": {"num_slots": NUM_SLOTS, "max_seq_len": 256}, "serving": {"max_concurrent_requests": MAX_CONCURRENT},
    }))
    yield served
    served.close()


@pytest.fixture(scope="module")
def server(served):
    api = HttpApi(Frontend(served), observe_stream=lambda first, gaps: STREAMS_OBSERVED.append((first, gaps)))
    with UvicornThread(asgi_app(api), free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120.0) as client:
        yield client


def idle(served) -> bool:
    return served.loop.num_requests == 0 and served.loop.engine.verifier.num_free_slots == NUM_SLOTS


def test_greedy_completion_of_token_ids_equals_the_target_alone(client, tokenizer, prompt_ids, hf_greedy):
    response = client.completions.create(model=MODEL, prompt=prompt_ids[0], max_tokens=16, temperature=0)
    [choice] = response.choices
    assert response.object == "text_completion" and response.model == MODEL and response.id.startswith("cmpl-")
    assert choice.finish_reason == "length"
    assert response.usage.prompt_tokens == len(prompt_ids[0]) and response.usage.completion_tokens == 16
    assert response.usage.total_tokens == len(prompt_ids[0]) + 16
    assert choice.text == tokenizer.decode(hf_greedy(prompt_ids[0], 16), skip_special_tokens=True)
    stats = response.model_extra["speculation"]
    assert stats["rounds"] < 16 and stats["drafted"] > 0


def test_the_text_is_the_targets_greedy_continuation(client, tokenizer, hf_greedy):
    prompt = "def parse(line):"
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    assert text == tokenizer.decode(hf_greedy(tokenizer(prompt, add_special_tokens=False)["input_ids"], 12),
                                    skip_special_tokens=True)


def test_a_stream_sends_one_event_per_round_and_ends_with_done(client, server):
    body = {"model": MODEL, "prompt": "class Stack:", "max_tokens": 24, "temperature": 0,
            "speculation": {"mode": "on", "gamma": 3}}
    unary = client.completions.create(**{k: v for k, v in body.items() if k != "speculation"},
                                      extra_body={"speculation": body["speculation"]})
    STREAMS_OBSERVED.clear()
    lines = sse_lines(server.url, "/v1/completions", body)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == unary.choices[0].text
    assert len(chunks) == chunks[-1]["speculation"]["rounds"] == unary.model_extra["speculation"]["rounds"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    [(first_s, gaps)] = STREAMS_OBSERVED  # time to first tokens and the gaps after, for the TTFT / ITL metrics
    assert first_s > 0 and len(gaps) == len(chunks) - 1 and sum(n for _, n in gaps) + 1 <= 24


def test_the_official_client_streams_completions_with_usage(client):
    stream = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=20, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    completion = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=20, temperature=0)
    assert text == completion.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_chat_completions_unary_and_streaming(client, tokenizer, hf_greedy):
    messages = [{"role": "system", "content": "Python only."}, {"role": "user", "content": "a stack class"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == tokenizer.decode(hf_greedy(ids, 10), skip_special_tokens=True)
    assert response.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == response.choices[0].message.content


def test_seeded_sampling_is_reproducible(client):
    def run(seed):
        return client.completions.create(model=MODEL, prompt="import os", max_tokens=16, temperature=0.9, top_p=0.95,
                                         seed=seed).choices[0].text

    assert run(11) == run(11) != run(12)


def test_models_and_health(client, server):
    [model] = client.models.list().data
    assert model.id == MODEL and model.model_extra["speculation"]["proposers"] == ["draft", "ngram"]
    status, body = get(server.url, "/health")
    assert status == 200 and body["status"] == "serving" and body["ready"] and body["problems"] == []


@pytest.mark.parametrize("kwargs, param", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"prompt": [10**7]}, "prompt"),
    ({"n": 129}, "n"),
    ({"prompt": []}, "prompt"),
    ({"extra_body": {"top_k": -2}}, "top_k"),
    ({"extra_body": {"speculation": {"proposer": "oracle"}}}, "speculation.proposer"),
    ({"prompt": ""}, "prompt"),
])
def test_bad_input_is_400_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**{"model": MODEL, "prompt": "x", "max_tokens": 4, **kwargs})
    assert error.value.param == param and error.value.type == "invalid_request_error"
    assert param in error.value.message


def _nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", _nested(100_000), "body"),
    ("/v1/completions", '{"prompt": "x", "stop": %s}' % _nested(50_000, '"a"'), "body"),
    ("/v1/completions", '{"prompt": "x", "stop": %s}' % _nested(12, '"a"'), "stop"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % ('{"a": ' * 40 + "1" + "}" * 40),
     "messages"),
    ("/v1/chat/completions", '{"messages": [{"role": %s, "content": "x"}]}' % _nested(900), "messages"),
    ("/v1/completions", '{"prompt": "ab\\ud800cd"}', "prompt"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "ab\\ud800cd"}]}', "messages[0].content"),
    ("/v1/completions", '{"prompt": "x", "stop": ["\\udfff"]}', "stop[0]"),
    ("/v1/completions", '{"prompt": "x", "top_k": 2147483648}', "top_k"),
    ("/v1/completions", '{"prompt": "x", "temperature": 1e400}', "temperature"),
])
def test_bodies_that_once_reached_a_500_are_400_naming_the_field(server, path, body, param):
    """Deep nesting, lone UTF-16 surrogates and an int32-overflowing top_k (the held-out fuzz's 500s)."""
    status, answer = post_raw(server.url, path, body.replace('{"', '{"max_tokens": 2, "', 1))
    assert status == 400 and answer["error"]["param"] == param, answer


@pytest.mark.parametrize("sampling", [{"temperature": 1e39}, {"temperature": 1e300}, {"temperature": 1e-300},
                                      {"temperature": 1.0, "top_p": 1e-50}, {"temperature": 1.0, "top_p": 5e-324}])
def test_extreme_but_valid_sampling_values_are_served(client, sampling):
    """Any finite temperature > 0 and any top_p in (0, 1] is served as asked (not a 500)."""
    choice = client.completions.create(model=MODEL, prompt="def f():", max_tokens=3, seed=1, **sampling).choices[0]
    assert choice.finish_reason == "length"


def test_a_body_shorter_than_its_content_length_is_400_after_the_body_timeout(served):
    """A client that promises more body than it sends is answered, not held forever."""
    import socket
    import time

    with UvicornThread(asgi_app(HttpApi(Frontend(served), body_timeout_s=0.5)), free_port()) as slow:
        port = int(slow.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": \"x\"")
            started = time.monotonic()
            answer = sock.recv(65536).decode()
            assert time.monotonic() - started < 5.0
        assert answer.startswith("HTTP/1.1 400") and '"param":"body"' in answer, answer
        status, _ = post(slow.url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert status == 200


def test_a_fuzz_campaign_of_bad_bodies_is_all_400_naming_a_field_and_harms_nobody(client, server, served, tokenizer,
                                                                                 hf_greedy):
    """scripts/fuzz_http.py's cases (nesting, surrogates, extreme floats, ...), 10 of each: no
    5xx, no hang, every refusal names its field, the valid extremes are served."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import fuzz_http

    outcomes = fuzz_http.run_campaign(server.url, count=130, seed=11, timeout_s=30.0)
    assert len(outcomes) == 13 and fuzz_http.unexpected(outcomes) == {}, outcomes
    assert wait_until(lambda: idle(served))
    prompt = tokenizer("import os\n", add_special_tokens=False)["input_ids"]
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    assert text == tokenizer.decode(hf_greedy(prompt, 12), skip_special_tokens=True)


def test_bad_input_to_a_stream_is_400_too_and_the_server_goes_on(client, prompt_ids, hf_greedy):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "nobody", "content": "x"}], stream=True)
    assert error.value.param == "messages[0].role"
    text = client.completions.create(model=MODEL, prompt=prompt_ids[1], max_tokens=6, temperature=0).choices[0].text
    assert text  # still serving


def test_under_a_route_prefix_the_paths_are_below_it(served):
    """`serve deploy` configs may mount the app at a prefix (the ASGI root_path)."""
    import asyncio

    from starlette.requests import Request

    scope = {"type": "http", "method": "GET", "path": "/specdec/v1/models", "root_path": "/specdec",
             "headers": [], "query_string": b""}
    response = asyncio.run(HttpApi(Frontend(served)).handle(Request(scope)))
    assert response.status_code == 200 and json.loads(response.body)["data"][0]["id"] == MODEL


def test_chat_with_a_model_without_a_template_is_400_naming_messages(client, served):
    template, served.tokenizer.chat_template = served.tokenizer.chat_template, None
    try:
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    finally:
        served.tokenizer.chat_template = template
    assert error.value.param == "messages" and "no chat template" in error.value.message


class FailingMidStream:
    """A frontend whose stream yields one round, then loses its target worker."""

    model, proposers, is_ready = MODEL, ("ngram",), True

    def ready(self):
        return self

    async def stream(self, request):
        from specdec.requests.errors import WorkerError
        from specdec.serving.frontend import Delta

        yield Delta("def", [1])
        raise WorkerError("the target worker is unreachable")


def test_a_failure_after_the_first_round_ends_the_stream_with_an_error_event():
    import asyncio

    from starlette.requests import Request

    async def main():
        body = json.dumps({"model": MODEL, "prompt": "x", "stream": True}).encode()

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
        response = await HttpApi(FailingMidStream()).handle(Request(scope, receive))
        return response.status_code, [chunk async for chunk in response.body_iterator]

    status, events = asyncio.run(main())
    assert status == 200 and len(events) == 2 and "[DONE]" not in "".join(events)
    assert json.loads(events[0][len("data: "):])["choices"][0]["text"] == "def"
    error = json.loads(events[1][len("data: "):])["error"]
    assert error["code"] == "unavailable" and "unreachable" in error["message"]


def test_an_unknown_route_is_404_and_a_wrong_method_405_in_openais_shape(server):
    status, body = post(server.url, "/v1/embeddings", {"input": "x"})
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body = get(server.url, "/v1/completions")
    assert status == 405 and body["error"]["code"] == "method_not_allowed" and "POST" in body["error"]["message"]


def test_past_the_admission_limit_it_is_429_and_dropped_streams_free_their_slots(client, server, served):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 200, "temperature": 0}
    streams = [OpenStream(server.url, "/v1/completions", body) for _ in range(MAX_CONCURRENT)]
    try:
        with pytest.raises(openai.RateLimitError) as error:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert error.value.code == "admission_limit" and "max_concurrent_requests" in error.value.message
    finally:
        for stream in streams:
            stream.drop()  # the client disconnects mid-stream
    assert wait_until(lambda: idle(served))


def test_a_client_that_disconnects_before_its_unary_answer_frees_its_slots(server, served):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 240, "temperature": 0,
            "speculation": {"mode": "off"}}  # ~240 rounds: far longer than the wait below
    request = OpenUnary(server.url, "/v1/completions", body)
    assert wait_until(lambda: served.loop.num_requests == 1)
    request.drop()
    assert wait_until(lambda: idle(served), timeout_s=0.8)


def test_past_its_deadline_a_request_is_504_and_frees_its_slots(client, served):
    with pytest.raises(openai.APIStatusError) as error:
        client.completions.create(model=MODEL, prompt="def parse(line):", max_tokens=200,
                                  extra_body={"timeout_s": 0.05})
    assert error.value.status_code == 504 and error.value.code == "deadline_exceeded"
    assert wait_until(lambda: idle(served))


def test_while_the_models_load_it_is_503(client, server, served):
    frontend = Frontend()  # nothing loaded yet
    with UvicornThread(asgi_app(HttpApi(frontend)), free_port()) as loading:
        with openai.OpenAI(base_url=f"{loading.url}/v1", api_key="unused", max_retries=0) as early:
            with pytest.raises(openai.APIStatusError) as error:
                early.completions.create(model=MODEL, prompt="x")
        assert error.value.status_code == 503 and "still loading" in error.value.message
        status, body = get(loading.url, "/health")
        assert status == 503 and body["problems"] == ["models are still loading"]


def test_with_tokens_only_a_valid_bearer_token_is_served_and_health_stays_open(served):
    """The openai client sends its api_key as `authorization: Bearer ...`: the right one is
    served, a wrong or missing one gets 401 in OpenAI's error shape, /health needs none."""
    import urllib.request

    from specdec.serving.api_auth import ApiTokens

    api = HttpApi(Frontend(served), authorize=ApiTokens.of(["team-token"]).check)
    with UvicornThread(asgi_app(api), free_port()) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="team-token", max_retries=0) as good:
            assert good.completions.create(model=MODEL, prompt="def f():", max_tokens=3, temperature=0).choices
        for key in ("wrong-token", ""):
            with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key or "x", max_retries=0,
                               default_headers={"authorization": ""} if not key else None) as bad:
                with pytest.raises(openai.AuthenticationError) as error:
                    bad.completions.create(model=MODEL, prompt="def f():", max_tokens=3)
                assert error.value.status_code == 401
                assert error.value.body["code"] == "invalid_api_key"
                assert "wrong-token" not in error.value.body["message"]
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"{server.url}/v1/models")
        assert error.value.code == 401
        with urllib.request.urlopen(f"{server.url}/health") as response:
            assert response.status == 200
