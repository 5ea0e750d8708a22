"""Emitted tokens' logprobs: the log of the target's processed distribution at each emitted
token's position (temperature 1 for greedy requests), with the top alternatives; the same with
speculation on and off, greedy and seeded, up to float32 rounding of the target's logits."""

import math

import pytest
import torch

from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.sampling.token_logprobs import MAX_TOP_LOGPROBS, emitted_logprobs

TOLERANCE = 1e-5  # logits of one position differ in float32 rounding with the forward's width


def test_the_logprob_is_the_log_softmax_at_the_requests_temperature_and_the_top_come_first():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    emitted = [4, 17, 30]
    got = emitted_logprobs(logits, SamplingParams(temperature=0.5), emitted, top=3)
    expected = torch.log_softmax(logits.double() / 0.5, dim=-1)
    for j, token in enumerate(got):
        assert token.token_id == emitted[j] and math.isclose(token.logprob, expected[j, emitted[j]], abs_tol=1e-9)
        assert [t for t, _ in token.top] == expected[j].topk(3).indices.tolist()
        assert all(a >= b for (_, a), (_, b) in zip(token.top, token.top[1:]))


def test_a_greedy_request_reports_temperature_1_and_top_k_removes_tokens():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    greedy = emitted_logprobs(logits, SamplingParams(temperature=0.0), [0, 1], top=0)
    expected = torch.log_softmax(logits.double(), dim=-1)
    assert [t.logprob for t in greedy] == pytest.approx([expected[0, 0].item(), expected[1, 1].item()], abs=1e-9)
    assert greedy[0].top == ()
    worst = int(logits[0].argmin())
    [cut] = emitted_logprobs(logits[:1], SamplingParams(temperature=1.0, top_k=5), [worst], top=5)
    assert cut.logprob == float("-inf") and math.isclose(sum(math.exp(v) for _, v in cut.top), 1.0, rel_tol=1e-9)


def test_logit_bias_and_penalties_are_in_the_reported_distribution_each_position_seeing_the_tokens_before_it():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(2))
    history, emitted = [7, 9], [3, 11]  # a one-token prompt (7), then 9 generated before the round
    params = SamplingParams(temperature=1.0, presence_penalty=1.5, logit_bias={11: 4.0})
    got = emitted_logprobs(logits, params, emitted, top=0, history=history, num_prompt_tokens=1)
    for j, token in enumerate(got):
        x = logits[j].double().clone()
        x[11] += 4.0
        for seen in {9, *emitted[:j]}:  # generated before position j: the prompt is not penalised
            x[seen] -= 1.5
        assert math.isclose(token.logprob, torch.log_softmax(x, dim=-1)[emitted[j]].item(), abs_tol=1e-9), j


def test_a_request_asks_for_at_most_20_alternatives():
    with pytest.raises(ValueError, match="logprobs"):
        GenerationRequest((1, 2), logprobs=MAX_TOP_LOGPROBS + 1)
    assert GenerationRequest((1, 2), logprobs=MAX_TOP_LOGPROBS).logprobs == MAX_TOP_LOGPROBS


@pytest.fixture(scope="module")
def built(make_engine):
    return make_engine("draft", gamma=4, num_slots=4)


def _generate(built, prompt_ids, sampling: SamplingParams, mode: str):
    requests = [GenerationRequest(tuple(p), 20, sampling, ignore_eos=True, mode=mode, logprobs=4) for p in prompt_ids]
    return built.engine.generate(requests)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=7)],
                         ids=["greedy", "seeded"])
def test_logprobs_are_the_same_with_speculation_on_and_off(built, prompt_ids, sampling):
    on, off = _generate(built, prompt_ids[:3], sampling, "on"), _generate(built, prompt_ids[:3], sampling, "off")
    assert sum(r.stats.drafted for r in on) > 0 and sum(r.stats.drafted for r in off) == 0
    for a, b in zip(on, off):
        assert a.token_ids == b.token_ids and len(a.logprobs) == len(a.token_ids) == 20
        assert [t.token_id for t in a.logprobs] == a.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.logprob == pytest.approx(y.logprob, abs=TOLERANCE) and x.logprob <= 0
            assert [v for _, v in x.top] == pytest.approx([v for _, v in y.top], abs=TOLERANCE)
            same = {t: v for t, v in x.top if dict(y.top).get(t) is not None}
            assert len(same) >= len(x.top) - 1  # only a near-tie at the edge may swap an alternative


def test_without_logprobs_asked_there_are_none(built, prompt_ids):
    [result] = built.engine.generate([GenerationRequest(tuple(prompt_ids[0]), 4)])
    assert result.logprobs is None
