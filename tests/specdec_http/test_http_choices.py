"""Several choices and echoed prompts over HTTP (uvicorn on 127.0.0.1, in-process models).

`n` samples per prompt and a list of prompts answer one choice each, indexed as OpenAI
(prompt i // n, sample i % n), unary and streamed (chunks of the choices interleave, each
naming its index); a seed makes the whole response reproducible, its first sample equal to
the n = 1 request. `echo` prepends the prompt, and with `logprobs` its tokens' logprobs
(the first null), which equal the target's log_softmax over the prompt; `max_tokens: 0`
scores the prompt alone (lm-eval's loglikelihood payload). Logprobs are the same with
speculation on and off.
"""

from __future__ import annotations

import json

import pytest
import torch

from openai_http import UvicornThread, post, sse_lines
from specdec.config.config import load_config
from specdec.serving.frontend import Frontend
from specdec.wiring.engine_builder import build_served_engine
from specdec.wiring.ports import free_port
from specdec_http.http_api import HttpApi, asgi_app

MODEL = "bundled:target"
ON, OFF = {"mode": "on", "gamma": 4}, {"mode": "off"}


@pytest.fixture(scope="module")
def server():
    served = build_served_engine(load_config(overrides={
        "cache": {"num_slots": 8, "max_seq_len": 256}, "serving": {"max_concurrent_requests": 8},
    }))
    with UvicornThread(asgi_app(HttpApi(Frontend(served))), free_port()) as server:
        yield server
    served.close()


def completions(server, **body) -> dict:
    status, answer = post(server.url, "/v1/completions", {"model": MODEL, **body})
    assert status == 200, answer
    return answer


def streamed_texts(server, path: str, body: dict) -> tuple[dict[int, str], list[dict]]:
    """Each choice's text joined over the stream's chunks, and the chunks."""
    lines = sse_lines(server.url, path, {"model": MODEL, **body})
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            part = choice["delta"].get("content", "") if "delta" in choice else choice["text"]
            texts[choice["index"]] = texts.get(choice["index"], "") + part
    return texts, chunks


def test_n_seeded_samples_are_indexed_reproducible_and_the_first_is_the_single_request(server, prompt_ids):
    body = {"prompt": prompt_ids[0], "max_tokens": 12, "temperature": 1.0, "seed": 7}
    answer = completions(server, n=3, **body)
    texts = [c["text"] for c in answer["choices"]]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert completions(server, n=3, **body)["choices"] == answer["choices"]
    assert texts[0] == completions(server, **body)["choices"][0]["text"]
    assert len(set(texts)) > 1  # the samples draw apart
    assert answer["usage"]["prompt_tokens"] == len(prompt_ids[0]) and answer["usage"]["completion_tokens"] == 36


def counts(usage: dict) -> dict:
    """The usage's token counts (the cached prompt tokens depend on what ran before)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def test_a_list_of_prompts_answers_n_choices_per_prompt_unary_and_streamed(server, prompt_ids, tokenizer, hf_greedy):
    prompts = [prompt_ids[1], prompt_ids[2]]
    body = {"prompt": prompts, "n": 2, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    answer = completions(server, **body)
    expected = [tokenizer.decode(hf_greedy(p, 8), skip_special_tokens=True) for p in prompts]
    assert [c["text"] for c in answer["choices"]] == [expected[0], expected[0], expected[1], expected[1]]
    assert counts(answer["usage"]) == {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": 32,
                               "total_tokens": sum(map(len, prompts)) + 32}
    texts, chunks = streamed_texts(server, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert texts == {i: c["text"] for i, c in enumerate(answer["choices"])}
    assert chunks[-1]["choices"] == [] and counts(chunks[-1]["usage"]) == counts(answer["usage"])
    assert sum(1 for c in chunks for choice in c["choices"] if choice["finish_reason"]) == 4


def test_chat_answers_n_choices_and_refuses_echo(server):
    body = {"messages": [{"role": "user", "content": "Write a loop"}], "max_tokens": 6, "temperature": 0.8,
            "seed": 3, "n": 2}
    status, answer = post(server.url, "/v1/chat/completions", {"model": MODEL, **body})
    assert status == 200 and [c["index"] for c in answer["choices"]] == [0, 1]
    texts, _ = streamed_texts(server, "/v1/chat/completions", body)
    assert texts == {c["index"]: c["message"]["content"] for c in answer["choices"]}
    status, error = post(server.url, "/v1/chat/completions", {"model": MODEL, **body, "echo": True})
    assert status == 400 and error["error"]["param"] == "echo"


@pytest.fixture(scope="module")
def reference(hf_target, prompt_ids):
    """log_softmax of the target over prompt_ids[0]: [P - 1, V]."""
    with torch.no_grad():
        return torch.log_softmax(hf_target(torch.tensor([prompt_ids[0]])).logits[0, :-1].double(), -1)


def test_echo_with_max_tokens_0_returns_the_prompt_and_its_logprobs(server, prompt_ids, tokenizer, reference):
    prompt = prompt_ids[0]
    [choice] = completions(server, prompt=prompt, max_tokens=0, echo=True, logprobs=2)["choices"]
    assert choice["text"] == tokenizer.decode(prompt) and choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [tokenizer.decode([t]) for t in prompt]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = reference.gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-5)
    best = reference.max(-1).values.tolist()  # (alternatives are keyed by text: two may share one)
    assert [max(top.values()) for top in logprobs["top_logprobs"][1:]] == pytest.approx(best, abs=1e-5)
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"]) and logprobs["text_offset"][0] == 0


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 11}])
def test_echoed_and_generated_logprobs_are_the_same_with_speculation_on_and_off(server, prompt_ids, sampling):
    body = {"prompt": prompt_ids[0], "max_tokens": 10, "echo": True, "logprobs": 3, "n": 2, **sampling}
    on, off = completions(server, speculation=ON, **body), completions(server, speculation=OFF, **body)
    assert on["speculation"]["drafted"] > 0 and off["speculation"]["drafted"] == 0
    for a, b in zip(on["choices"], off["choices"]):
        assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        assert len(a["logprobs"]["tokens"]) == len(prompt_ids[0]) + 10
        assert a["logprobs"]["token_logprobs"][1:] == pytest.approx(b["logprobs"]["token_logprobs"][1:], abs=1e-5)
    assert on["choices"][1]["logprobs"]["token_logprobs"][: len(prompt_ids[0])] == \
        on["choices"][0]["logprobs"]["token_logprobs"][: len(prompt_ids[0])]  # one prompt, one scoring


def test_a_streamed_echo_starts_each_choice_with_its_prompt(server, prompt_ids, tokenizer):
    body = {"prompt": prompt_ids[1], "max_tokens": 5, "echo": True, "logprobs": 1, "n": 2, "temperature": 0}
    unary = completions(server, **body)
    texts, chunks = streamed_texts(server, "/v1/completions", body)
    assert texts == {i: c["text"] for i, c in enumerate(unary["choices"])}
    assert all(t.startswith(tokenizer.decode(prompt_ids[1])) for t in texts.values())
    tokens = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            tokens.setdefault(choice["index"], []).extend(choice["logprobs"]["token_logprobs"])
    assert tokens == {i: c["logprobs"]["token_logprobs"] for i, c in enumerate(unary["choices"])}


def test_a_streamed_echo_with_max_tokens_0_is_the_prompt_alone(server, prompt_ids, tokenizer):
    body = {"prompt": prompt_ids[2], "max_tokens": 0, "echo": True, "logprobs": 0}
    texts, chunks = streamed_texts(server, "/v1/completions", body)
    assert texts == {0: tokenizer.decode(prompt_ids[2])}
    [choice] = [c for chunk in chunks for c in chunk["choices"] if c["logprobs"]["tokens"]]
    assert choice["logprobs"]["token_logprobs"][0] is None and len(choice["logprobs"]["tokens"]) == len(prompt_ids[2])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
