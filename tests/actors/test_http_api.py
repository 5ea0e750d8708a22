"""The OpenAI-compatible HTTP API end to end: real Ray, the draft worker and the target group
as actors, the SpecdecRouter behind Ray Serve's HTTP proxy (and its gRPC proxy, the same
app) on 127.0.0.1, called with the official `openai` client.

Greedy output over HTTP equals the gRPC output and transformers' generate of the target;
chat goes through the bundled chat template; streams end with `data: [DONE]`; seeds
reproduce; 400 names the field, 429 past the admission limit, 504 past the request's
deadline, 503 once the workers are gone; a client that disconnects mid-stream (or runs
into its deadline) leaves no slot allocated on the workers.
The app is started once for the module; the last test stops the workers.
"""

from __future__ import annotations

import json

import openai
import pytest
import ray

from actors.app import free_port, start_app
from openai_http import OpenStream, OpenUnary, get, post, sse_lines, wait_until
from specdec.config.config import load_config
from specdec.requests.grammar_spec import GrammarSpec
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec_rpc.public.client import SpecdecClient
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from worker_slots import free_slots_within

NUM_SLOTS = 8
MAX_CONCURRENT = 4
MODEL = "bundled:target"
ORIGIN = "http://ui.example"


@pytest.fixture(scope="module")
def app():
    config = load_config(overrides={
        "cache": {"num_slots": NUM_SLOTS, "max_seq_len": 256},
        "serving": {"port": free_port(), "http_port": free_port(), "host": "127.0.0.1",
                    "max_concurrent_requests": MAX_CONCURRENT, "worker_timeout_s": 10.0},
        "security": {"cors_allowed_origins": [ORIGIN]},
    })
    app = start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
    yield app
    app.shutdown()


@pytest.fixture(scope="module")
def client(app):
    with openai.OpenAI(base_url=f"{app.http_url}/v1", api_key="unused", max_retries=0, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def workers(app):
    verifier, proposer = RemoteVerifier(app.target_address), RemoteProposer(app.draft_address)
    yield verifier, proposer
    verifier.close()
    proposer.close()


def wait_for_free_slots(workers, timeout_s: float = 15.0) -> tuple[int, int]:
    return free_slots_within(workers, NUM_SLOTS, timeout_s)


def test_both_protocols_are_served_by_the_same_app(app, client):
    status, health = get(app.http_url, "/health")
    assert status == 200 and health["ready"] and health["status"] == "serving"
    assert [m.id for m in client.models.list().data] == [MODEL]
    with SpecdecClient(app.address, timeout_s=30.0) as grpc_client:
        assert grpc_client.health() == "SERVING"


def test_greedy_output_equals_grpc_and_transformers(app, client, tokenizer, prompt_ids, hf_greedy):
    prompt, n = prompt_ids[1], 20
    http = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"speculation": {"mode": "on"}})
    with SpecdecClient(app.address, timeout_s=120.0) as grpc_client:
        over_grpc = grpc_client.generate(prompt_token_ids=prompt, max_new_tokens=n, mode="on")
    assert list(over_grpc.token_ids) == hf_greedy(prompt, n)
    assert http.choices[0].text == over_grpc.text == tokenizer.decode(hf_greedy(prompt, n), skip_special_tokens=True)
    assert http.usage.completion_tokens == n and http.usage.prompt_tokens == len(prompt)
    stats = http.model_extra["speculation"]
    assert stats["drafted"] > 0 and stats["accepted"] > 0 and stats["rounds"] < n


def test_chat_through_the_bundled_template_equals_transformers(client, tokenizer, hf_greedy):
    messages = [{"role": "user", "content": "parse a CSV line"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]
    assert response.choices[0].message.content == tokenizer.decode(hf_greedy(ids, 12), skip_special_tokens=True)
    streamed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == response.choices[0].message.content


def test_a_stream_sends_rounds_as_events_and_ends_with_done(app, client):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 24, "temperature": 0,
            "speculation": {"mode": "on", "gamma": 4}}
    lines = sse_lines(app.http_url, "/v1/completions", body)
    assert lines[-1] == "[DONE]" and len(lines) > 3
    chunks = [json.loads(line) for line in lines[:-1]]
    unary = client.completions.create(model=MODEL, prompt="def parse(line):", max_tokens=24, temperature=0,
                                      extra_body={"speculation": {"mode": "on", "gamma": 4}})
    assert "".join(c["choices"][0]["text"] for c in chunks) == unary.choices[0].text
    assert len(chunks) == chunks[-1]["speculation"]["rounds"]


def test_seeded_sampling_is_reproducible(client):
    def run(seed):
        return client.completions.create(model=MODEL, prompt="import sys", max_tokens=16, temperature=0.8,
                                         seed=seed).choices[0].text

    assert run(5) == run(5) != run(6)


def test_a_seeded_sampled_request_gives_one_text_over_both_apis_with_speculation_on_or_off(app, client, make_engine):
    """Seeded sampled output does not depend on speculation (specdec.sampling.gumbel_sampling): mode
    ON and OFF, over HTTP and gRPC, give the in-process engine's tokens."""
    prompt, sampling = "def parse(line):", {"temperature": 0.9, "top_p": 0.95, "seed": 2024}
    local = make_engine("draft", gamma=4)
    [expected] = local.engine.generate([GenerationRequest(local.encode(prompt), 32, SamplingParams(**sampling))])
    with SpecdecClient(app.address, timeout_s=120.0) as grpc_client:
        by_grpc = {mode: grpc_client.generate(prompt, max_new_tokens=32, mode=mode, **sampling)
                   for mode in ("on", "off")}
    by_http = {mode: client.completions.create(model=MODEL, prompt=prompt, max_tokens=32,
                                               extra_body={"speculation": {"mode": mode}}, **sampling)
               for mode in ("on", "off")}
    assert by_grpc["on"].stats.drafted > 0 and by_grpc["off"].stats.drafted == 0
    assert [list(r.token_ids) for r in by_grpc.values()] == [expected.token_ids] * 2
    assert {r.choices[0].text for r in by_http.values()} == {by_grpc["on"].text}


def test_logprobs_through_the_router_equal_the_in_process_engines_and_metrics_are_on_the_api_port(
        app, client, make_engine):
    """The remote target reports logprobs (speculation on, seeded) as the in-process engine
    does; GET /metrics through Serve's HTTP proxy is the router's Prometheus text."""
    import http.client
    import re

    prompt, sampling = "def parse(line):", {"temperature": 0.8, "top_k": 40, "seed": 11}
    local = make_engine("draft", gamma=4)
    request = GenerationRequest(local.encode(prompt), 12, SamplingParams(**sampling), logprobs=2)
    [expected] = local.engine.generate([request])
    choice = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, logprobs=2,
                                       extra_body={"speculation": {"mode": "on"}, "top_k": 40},
                                       temperature=0.8, seed=11).choices[0]
    assert choice.logprobs.token_logprobs == pytest.approx([t.logprob for t in expected.logprobs], abs=1e-5)
    assert [len(top) for top in choice.logprobs.top_logprobs] == [2] * 12
    host, port = app.http_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    assert response.status == 200 and f'specdec_kv_cache_usage_ratio{{model="{MODEL}"}}' in text
    assert re.search(r"# TYPE specdec_spec_decode_num_draft_tokens(_total)? counter", text)


def test_structured_output_through_the_router_equals_the_in_process_engine_without_speculation(app, client,
                                                                                             make_engine):
    """A JSON schema (HTTP response_format, gRPC GenerateRequest.grammar), seeded and sampled with
    speculation on through the router and the workers (the masks travel to the target), gives the
    in-process engine's tokens without speculation; the text is a valid object."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    prompt, sampling = "def parse(line):", {"temperature": 1.0, "seed": 7}
    local = make_engine("none", gamma=0)
    grammar = GrammarSpec("json_schema", json.dumps(schema))
    [expected] = local.engine.generate([GenerationRequest(local.encode(prompt), 16, SamplingParams(**sampling),
                                                          grammar=grammar)])
    with SpecdecClient(app.address, timeout_s=120.0) as grpc_client:
        by_grpc = grpc_client.generate(prompt, max_new_tokens=16, mode="on", grammar=(grammar.kind, grammar.text),
                                       **sampling)
    by_http = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, extra_body={
        "speculation": {"mode": "on"}, "response_format": {"type": "json_schema",
                                                           "json_schema": {"name": "a", "schema": schema}}}, **sampling)
    assert list(by_grpc.token_ids) == expected.token_ids and by_grpc.stats.drafted > 0
    assert by_http.choices[0].text == by_grpc.text == expected.text and set(json.loads(expected.text)) == {"ok"}



def test_a_repeated_long_prompt_reports_its_cached_tokens_in_usage_and_metrics(app, client):
    """The same long prompt again reads whole blocks of it from the target's prefix cache:
    usage.prompt_tokens_details.cached_tokens says how many (0 the first time; unary and a
    stream's usage chunk alike), the text is the same, and /metrics counts them."""
    import http.client
    import re

    prompt = "kvreserve " + " ".join(f"column_{i} = row[{i}]" for i in range(12))
    first, second = (client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
                     for _ in range(2))
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0 and second.choices[0].text == first.choices[0].text
    assert 0 < cached < second.usage.prompt_tokens and cached % 16 == 0
    messages = [{"role": "user", "content": prompt}]
    streams = [list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
               for _ in range(2)]
    assert [s[-1].usage.prompt_tokens_details.cached_tokens > 0 for s in streams] == [False, True]

    def counted() -> float:
        host, port = app.http_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        found = re.search(r"^specdec_cached_prompt_tokens_total\{[^}]*\} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    expected = cached + streams[1][-1].usage.prompt_tokens_details.cached_tokens
    assert wait_until(lambda: counted() >= expected), f"/metrics counted {counted()} cached tokens"


@pytest.mark.parametrize("kwargs, param", [
    ({"temperature": -1}, "temperature"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"n": 129}, "n"),  # above the 128 choices a request may ask for
])
def test_bad_input_is_400_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**{"model": MODEL, "prompt": "x", "max_tokens": 4, **kwargs})
    assert error.value.param == param


def test_an_unknown_model_is_404_and_the_tokenizer_routes_are_served(app, client, tokenizer):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=4)
    assert error.value.code == "model_not_found"
    status, body = post(app.http_url, "/tokenize", {"model": MODEL, "prompt": "import sys"})
    assert status == 200 and body["tokens"] == tokenizer("import sys", add_special_tokens=False)["input_ids"]
    assert body["max_model_len"] == 256 and client.models.list().data[0].model_extra["max_model_len"] == 256
    assert post(app.http_url, "/detokenize", {"tokens": body["tokens"]}) == (200, {"prompt": "import sys"})


def test_a_listed_origins_preflight_is_answered_through_serves_proxy(app):
    import http.client

    host, port = app.http_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("OPTIONS", "/v1/chat/completions", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 204 and response.headers["access-control-allow-origin"] == ORIGIN


def test_a_client_that_disconnects_mid_stream_frees_its_slots(app, workers):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 180, "speculation": {"mode": "on"}}
    stream = OpenStream(app.http_url, "/v1/completions", body)  # mode on: the draft holds a slot too
    assert wait_for_free_slots(workers, timeout_s=0) == (NUM_SLOTS - 1, NUM_SLOTS - 1)
    stream.drop()
    assert wait_for_free_slots(workers) == (NUM_SLOTS, NUM_SLOTS)


def test_a_client_that_disconnects_before_its_unary_answer_frees_its_slots(app, workers):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 180, "speculation": {"mode": "on"}}
    request = OpenUnary(app.http_url, "/v1/completions", body)
    assert wait_until(lambda: wait_for_free_slots(workers, timeout_s=0) == (NUM_SLOTS - 1, NUM_SLOTS - 1))
    request.drop()  # while it holds its slots
    assert wait_for_free_slots(workers) == (NUM_SLOTS, NUM_SLOTS)


def test_past_the_admission_limit_it_is_429(app, client, workers):
    body = {"model": MODEL, "prompt": "def parse(line):", "max_tokens": 180}
    streams = [OpenStream(app.http_url, "/v1/completions", body) for _ in range(MAX_CONCURRENT)]
    try:
        with pytest.raises(openai.RateLimitError) as error:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert error.value.code == "admission_limit"
    finally:
        for stream in streams:
            stream.drop()
    assert wait_for_free_slots(workers) == (NUM_SLOTS, NUM_SLOTS)


def test_past_its_deadline_a_request_is_504_and_frees_its_slots(client, workers):
    with pytest.raises(openai.APIStatusError) as error:
        client.completions.create(model=MODEL, prompt="def parse(line):", max_tokens=180, extra_body={"timeout_s": 0.2})
    assert error.value.status_code == 504
    assert wait_for_free_slots(workers) == (NUM_SLOTS, NUM_SLOTS)


def test_once_the_workers_are_gone_it_is_503(app, client):
    """Runs last: it stops the workers."""
    ray.get(app.hub.shutdown.remote())
    with pytest.raises(openai.APIStatusError) as error:
        client.completions.create(model=MODEL, prompt="x", max_tokens=8)
    assert error.value.status_code == 503
