"""Prompt logprobs: each prompt token's logprob under the target given the tokens before
it (the first has none) equals log_softmax of one in-process target forward over the whole
prompt, however the prompt was read: whole, in prefill chunks, partly from the prefix cache,
with speculation on or off. Identical prompts in one batch (a request's n choices) share one
prefill: the later ones fork the first one's slot, with the same output as alone."""

from __future__ import annotations

import pytest
import torch

from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

TOP = 3


@pytest.fixture(scope="module")
def prompts(prompt_ids) -> list[list[int]]:
    joined = [t for p in prompt_ids for t in p]
    return [joined[:70], joined[100:119], joined[200:201]]  # 70, 19 and 1 token(s)


@pytest.fixture(scope="module")
def reference(hf_target, prompts):
    """log_softmax of the target's logits over each whole prompt: [P - 1, V] per prompt."""
    with torch.no_grad():
        return [torch.log_softmax(hf_target(torch.tensor([p])).logits[0, :-1].double(), -1) for p in prompts]


def _scored(built, prompts, top=TOP, **fields):
    requests = [GenerationRequest(p, 3, SamplingParams(), ignore_eos=True, prompt_logprobs=top, **fields)
                for p in prompts]
    return built.engine.generate(requests)


def _assert_matches(result, prompt, expected):
    logprobs = result.prompt_logprobs
    assert len(logprobs) == len(prompt) and logprobs[0] is None
    for position, entry in enumerate(logprobs[1:], start=1):
        row = expected[position - 1]
        assert entry.token_id == prompt[position]
        assert entry.logprob == pytest.approx(row[prompt[position]].item(), abs=1e-5)
        best = row.topk(TOP)
        assert [i for i, _ in entry.top] == best.indices.tolist()
        assert [v for _, v in entry.top] == pytest.approx(best.values.tolist(), abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("proposer, gamma, chunk", [("draft", 4, 7), ("none", 0, 0)])
def test_prompt_logprobs_equal_one_forward_over_the_prompt(make_engine, prompts, reference, proposer, gamma, chunk):
    built = make_engine(proposer, gamma, scheduling={"prefill_chunk_tokens": chunk})
    first = _scored(built, prompts)
    again = _scored(built, prompts)  # the prompts' full blocks are in the prefix cache now
    for results in (first, again):
        for result, prompt, expected in zip(results, prompts, reference):
            _assert_matches(result, prompt, expected)
    plain = built.engine.generate([GenerationRequest(p, 3, SamplingParams(), ignore_eos=True) for p in prompts])
    assert [r.token_ids for r in plain] == [r.token_ids for r in first]  # scoring changes no output
    assert all(r.prompt_logprobs is None for r in plain)


def test_identical_prompts_in_one_batch_share_the_prefill(make_engine, prompts, monkeypatch):
    built = make_engine("draft", 4)
    sampling = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    alone = [built.engine.generate([GenerationRequest(prompts[0], 8, s, ignore_eos=True)])[0] for s in sampling]
    runner, forks = built.engine.verifier.runner, []
    fork = runner.fork_slot
    monkeypatch.setattr(runner, "fork_slot", lambda slot, length: forks.append(length) or fork(slot, length))
    together = built.engine.generate([GenerationRequest(prompts[0], 8, s, ignore_eos=True) for s in sampling])
    assert forks == [len(prompts[0]) - 1] * 2  # the second and third choice fork the first's prefill
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
