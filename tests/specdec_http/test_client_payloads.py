"""What real OpenAI-compatible clients send, over HTTP on in-process models (uvicorn on 127.0.0.1).

The exact default payloads of `vllm bench serve` (openai and openai-chat backends), of
SGLang's `bench_serving` (openai and openai-chat backends) and of GuideLLM (vLLM's
`continuous_usage_stats`: the usage so far on every chunk) are served and stream to `[DONE]`; an unknown
model is 404 `model_not_found`; `/tokenize` and `/detokenize` round-trip and need the
bearer token like every generation route; `/v1/models` says when the server started and
its context; CORS preflights are answered for listed origins only.
"""

from __future__ import annotations

import http.client
import json
import time

import pytest

from prometheus_client import CollectorRegistry

from specdec.wiring.ports import free_port
from openai_http import UvicornThread, get, post, sse_lines
from specdec.serving.api_auth import ApiTokens
from specdec.serving.frontend import Frontend
from specdec_http.cors import Cors
from specdec_http.metrics_route import MetricsRoute
from specdec_metrics.prometheus_metrics import exposition, prometheus_metric_classes
from specdec_metrics.router_metrics import RouterMetrics
from specdec_http.http_api import HttpApi, asgi_app

MODEL = "bundled:target"
MAX_SEQ_LEN = 256  # the shared server's context (conftest.py)
ORIGIN = "http://ui.example"
TOKEN = "team-token"


@pytest.fixture(scope="module")
def guarded(served):
    """A server with a bearer token, CORS for ORIGIN and /metrics (polled when scraped)."""
    frontend, registry = Frontend(served), CollectorRegistry()
    metrics = RouterMetrics(prometheus_metric_classes(registry), model=MODEL)

    def poll():
        metrics.update(served.loop.engine, None)
        metrics.observe_finished(frontend.requests.drain())

    api = HttpApi(frontend, authorize=ApiTokens.of([TOKEN]).check, cors=Cors([ORIGIN]),
                  metrics=MetricsRoute(lambda: exposition(registry), refresh=poll))
    with UvicornThread(asgi_app(api), free_port()) as server:
        yield server


def streamed(server, path: str, body: dict) -> list[dict]:
    """The chunks of a stream that must end with [DONE]."""
    lines = sse_lines(server.url, path, body)
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# What each tool sends, field for field (the values of the prompt and budget aside):
# vllm bench serve (vllm/benchmarks/lib/endpoint_request_func.py; temperature 0.0 is its default
# sampling parameter, merged in from extra_body; --ignore-eos adds ignore_eos: true)
VLLM_COMPLETIONS = {"model": MODEL, "prompt": "def parse(line):", "repetition_penalty": 1.0, "max_tokens": 12,
                    "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0}
VLLM_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a stack class"}]}],
             "max_completion_tokens": 12, "stream": True, "stream_options": {"include_usage": True},
             "temperature": 0.0}
# SGLang's python -m sglang.bench_serving --backend openai / openai-chat (ignore_eos unless --disable-ignore-eos)
SGLANG_COMPLETIONS = {"model": MODEL, "prompt": "class Stack:", "temperature": 0.0, "best_of": 1, "max_tokens": 12,
                      "stream": True, "ignore_eos": True}
SGLANG_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "a stack class"}], "temperature": 0.0,
               "max_tokens": 12, "stream": True}
# GuideLLM's openai_http backend (benchmarks/load_tool_sweep.sh): usage on every chunk, a fixed output length
GUIDELLM_USAGE = {"include_usage": True, "continuous_usage_stats": True}
GUIDELLM_COMPLETIONS = {"model": MODEL, "stream": True, "stream_options": GUIDELLM_USAGE, "max_tokens": 12,
                        "stop": None, "ignore_eos": True, "prompt": "def parse(line):"}
GUIDELLM_CHAT = {"model": MODEL, "stream": True, "stream_options": GUIDELLM_USAGE, "max_completion_tokens": 12,
                 "stop": None, "ignore_eos": True,
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "a stack class"}]}]}


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", VLLM_COMPLETIONS),
    ("/v1/completions", {**VLLM_COMPLETIONS, "ignore_eos": True}),  # vllm bench serve --ignore-eos
    ("/v1/chat/completions", VLLM_CHAT),
    ("/v1/chat/completions", {**VLLM_CHAT, "ignore_eos": True}),
    ("/v1/completions", SGLANG_COMPLETIONS),
    ("/v1/chat/completions", SGLANG_CHAT),
    ("/v1/completions", GUIDELLM_COMPLETIONS),
    ("/v1/chat/completions", GUIDELLM_CHAT),
], ids=["vllm-openai", "vllm-openai-ignore-eos", "vllm-openai-chat", "vllm-openai-chat-ignore-eos", "sglang-openai",
        "sglang-openai-chat", "guidellm-completions", "guidellm-chat"])
def test_the_default_payloads_of_load_tools_stream_to_done(server, path, body):
    chunks = streamed(server, path, body)
    options = body.get("stream_options") or {}
    if options.get("include_usage"):  # then the last chunk is the usage alone
        usage = chunks.pop()
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    assert chunks and chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert all(len(chunk["choices"]) == 1 for chunk in chunks)
    if body.get("ignore_eos"):
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    if options.get("continuous_usage_stats"):  # every chunk: the usage so far, the last one the request's
        so_far = [chunk["usage"]["completion_tokens"] for chunk in chunks]
        assert so_far == sorted(so_far) and chunks[-1]["usage"] == usage["usage"]
        assert {chunk["usage"]["prompt_tokens"] for chunk in chunks} == {usage["usage"]["prompt_tokens"]}
    else:
        assert all("usage" not in chunk for chunk in chunks)


def test_ignore_eos_generates_past_the_end_of_sequence_token(server, served, tokenizer):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 12, "temperature": 0}
    text = post(server.url, "/v1/completions", body)[1]["choices"][0]["text"]
    engine = served.loop.engine
    eos, engine.eos_token_ids = engine.eos_token_ids, (tokenizer(text, add_special_tokens=False)["input_ids"][2],)
    try:  # the greedy continuation's third token now ends a sequence
        ended = post(server.url, "/v1/completions", body)[1]
        ignored = post(server.url, "/v1/completions", {**body, "ignore_eos": True})[1]
    finally:
        engine.eos_token_ids = eos
    assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] < 12
    assert ignored["choices"][0]["finish_reason"] == "length" and ignored["choices"][0]["text"] == text


def test_the_neutral_values_leave_the_greedy_output_as_it_is(server):
    plain = {"model": MODEL, "prompt": "import os", "max_tokens": 10, "temperature": 0}
    neutral = {**plain, "repetition_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False,
               "top_k": -1, "min_p": 0, "response_format": {"type": "text"}, "best_of": 1, "n": 1, "seed": -5,
               "ignore_eos": False, "user": "someone"}
    status, answer = post(server.url, "/v1/completions", neutral)
    assert status == 200 and answer["choices"] == post(server.url, "/v1/completions", plain)[1]["choices"]


@pytest.mark.parametrize("name, value", [("repetition_penalty", 0), ("logit_bias", {"999999": 5}), ("top_logprobs", 2),
                                         ("response_format", {"type": "xml"}), ("best_of", 2)])
def test_a_value_that_would_change_the_output_is_400_naming_the_field(server, name, value):
    status, body = post(server.url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, name: value})
    assert status == 400 and body["error"]["param"] == name


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "top_k": 40, "seed": -3}],
                         ids=["greedy", "seeded"])
def test_logprobs_are_the_same_with_speculation_on_and_off_and_streamed_alike(server, sampling):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 12, "logprobs": 3, "ignore_eos": True,
            **sampling}
    on, off = ({**body, "speculation": {"mode": mode}} for mode in ("on", "off"))
    [on_choice], [off_choice] = (post(server.url, "/v1/completions", b)[1]["choices"] for b in (on, off))
    on_lp, off_lp = on_choice["logprobs"], off_choice["logprobs"]
    assert on_choice["text"] == off_choice["text"] and on_lp["tokens"] == off_lp["tokens"]
    assert len(on_lp["tokens"]) == 12 and "".join(on_lp["tokens"]) == on_choice["text"]
    assert on_lp["token_logprobs"] == pytest.approx(off_lp["token_logprobs"], abs=1e-5)
    assert all(len(top) == 3 for top in on_lp["top_logprobs"]) and on_lp["text_offset"][0] == 0
    chunks = streamed(server, "/v1/completions", {**off, "stream": True})
    assert sum((c["choices"][0]["logprobs"]["token_logprobs"] for c in chunks), []) == \
        pytest.approx(off_lp["token_logprobs"], abs=1e-5)
    assert sum((c["choices"][0]["logprobs"]["text_offset"] for c in chunks), []) == off_lp["text_offset"]


def test_chat_logprobs_have_one_entry_per_generated_token(server):
    body = {**VLLM_CHAT, "stream": False, "stream_options": None, "logprobs": True, "top_logprobs": 2}
    status, answer = post(server.url, "/v1/chat/completions", body)
    content = answer["choices"][0]["logprobs"]["content"]
    assert status == 200 and len(content) == answer["usage"]["completion_tokens"]
    assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= t["top_logprobs"][0]["logprob"] + 1e-9 for t in content)
    chunks = streamed(server, "/v1/chat/completions", {**VLLM_CHAT, "logprobs": True})
    assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in chunks if c["choices"]) == \
        chunks[-1]["usage"]["completion_tokens"]


def test_an_unknown_model_is_404_model_not_found(server):
    for path, body in [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", VLLM_CHAT),
                       ("/tokenize", {"prompt": "x"})]:
        status, answer = post(server.url, path, {**body, "model": "gpt-4o"})
        assert status == 404 and answer["error"]["code"] == "model_not_found" and "gpt-4o" in answer["error"]["message"]


def test_models_say_when_the_server_started_and_its_context(server):
    status, body = get(server.url, "/v1/models")
    [model] = body["data"]
    assert status == 200 and model["max_model_len"] == MAX_SEQ_LEN
    assert time.time() - 600 < model["created"] <= time.time()


def test_tokenize_and_detokenize_round_trip_as_the_server_encodes(server, tokenizer):
    text = "def parse(line):\n    return line.split(',')"
    status, body = post(server.url, "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200 and body["tokens"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_SEQ_LEN
    assert post(server.url, "/detokenize", {"tokens": body["tokens"]}) == (200, {"prompt": text})
    status, chat = post(server.url, "/tokenize", {"messages": VLLM_CHAT["messages"]})
    unary = post(server.url, "/v1/chat/completions", {**VLLM_CHAT, "stream": False, "stream_options": None})[1]
    assert status == 200 and chat["count"] == unary["usage"]["prompt_tokens"]  # the prompt the chat route used
    assert post(server.url, "/detokenize", {"tokens": [10**7]})[1]["error"]["param"] == "tokens"
    assert post(server.url, "/tokenize", {"prompt": "x", "add_special_tokens": True})[1]["error"]["param"] == \
        "add_special_tokens"


def request(server, method: str, path: str, headers: dict, body: dict | None = None) -> http.client.HTTPResponse:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}


def test_tokenize_needs_the_bearer_token_like_the_generation_routes(guarded):
    assert request(guarded, "POST", "/tokenize", {}, {"prompt": "x"}).status == 401
    ok = request(guarded, "POST", "/tokenize", {"authorization": f"Bearer {TOKEN}"}, {"prompt": "x"})
    assert ok.status == 200


def test_a_listed_origins_preflight_is_answered_without_a_token_and_its_calls_carry_the_header(guarded):
    preflight = request(guarded, "OPTIONS", "/v1/chat/completions", {"Origin": ORIGIN, **PREFLIGHT})
    assert preflight.status == 204 and preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    call = request(guarded, "POST", "/v1/completions", {"Origin": ORIGIN, "authorization": f"Bearer {TOKEN}"},
                   {"prompt": "x", "max_tokens": 2})
    assert call.status == 200 and call.headers["access-control-allow-origin"] == ORIGIN
    refused = request(guarded, "POST", "/v1/completions", {"Origin": ORIGIN}, {"prompt": "x"})
    assert refused.status == 401 and refused.headers["access-control-allow-origin"] == ORIGIN  # readable by the UI


def test_another_origins_preflight_gets_no_cors_headers_and_cors_is_off_by_default(guarded, server):
    other = request(guarded, "OPTIONS", "/v1/completions", {"Origin": "http://evil.example", **PREFLIGHT})
    assert other.status == 401 and "access-control-allow-origin" not in other.headers
    off = request(server, "OPTIONS", "/v1/completions", {"Origin": ORIGIN, **PREFLIGHT})
    assert off.status == 405 and "access-control-allow-origin" not in off.headers


def test_metrics_on_the_api_port_are_prometheus_text_behind_the_token(guarded):
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert request(guarded, "GET", "/metrics", {}).status == 401
    assert request(guarded, "POST", "/v1/completions", auth, {"prompt": "x", "max_tokens": 3}).status == 200
    host, port = guarded.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/metrics", headers=auth)
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    assert response.status == 200 and response.headers["content-type"].startswith("text/plain")
    finished = [line for line in text.splitlines() if line.startswith("specdec_requests_finished_total{")]
    assert finished and float(finished[0].rsplit(" ", 1)[1]) >= 1
    assert "specdec_generation_tokens_total" in text and f'model="{MODEL}"' in text

