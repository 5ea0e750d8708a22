"""Speculation may only change speed, for seeded sampled requests too: 12 seeds x 48 tokens
(benchmarks/bench_coupling.py checks 40) give the same text with speculation OFF, ON, AUTO
(the goodput policy), another proposer, and a draft that fails or answers for some rows
only in the middle of the requests.

A seeded sampled request is decoded by the coupled rule (specdec.sampling.gumbel_sampling): each
token is the Gumbel-max choice of the target's distribution under noise addressed by
(seed, position, token), whatever was drafted.
"""

from __future__ import annotations

import pytest

from specdec.proposers.drafts import Drafts
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

SEEDS = 12
MAX_NEW = 48


def requests(prompt_ids, mode: str) -> list[GenerationRequest]:
    """SEEDS seeded sampled requests (temperature 1.0 and 0.7, some with top-k / top-p)."""
    samplings = [SamplingParams(temperature=1.0, seed=s) if s % 2 else
                 SamplingParams(temperature=0.7, top_k=40 if s % 4 else 0, top_p=0.95, seed=2**63 + s)
                 for s in range(SEEDS)]
    return [GenerationRequest(prompt_ids[s % len(prompt_ids)], MAX_NEW, sampling, ignore_eos=True, mode=mode)
            for s, sampling in enumerate(samplings)]


class FlakyProposer:
    """Wraps a proposer: every 3rd call fails (the draft is down), every other call drafts
    for the even rows only (the others were late or out of slots)."""

    def __init__(self, inner):
        self.inner, self.names, self.calls, self.has_probs = inner, inner.names, 0, inner.has_probs

    def unavailable(self, name):
        return None

    def propose(self, asks):
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("the draft is down")
        proposal = self.inner.propose(asks)
        if self.calls % 3 == 2:
            proposal[1::2] = [Drafts() for _ in proposal[1::2]]
        return proposal

    def release(self, seq_id):
        self.inner.release(seq_id)


def _run(built, prompt_ids, mode: str) -> tuple[list[list[int]], int]:
    results = built.engine.generate(requests(prompt_ids, mode))
    return [r.token_ids for r in results], sum(r.stats.drafted for r in results)


@pytest.fixture(scope="module")
def reference(make_engine, prompt_ids) -> list[list[int]]:
    """The requests decoded with speculation off."""
    tokens, drafted = _run(make_engine("draft", gamma=4, num_slots=SEEDS), prompt_ids, "off")
    assert drafted == 0 and all(len(t) == MAX_NEW for t in tokens)
    return tokens


@pytest.mark.slow
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_speculation_on_gives_the_text_of_speculation_off(make_engine, prompt_ids, reference, proposer):
    tokens, drafted = _run(make_engine(proposer, gamma=4, num_slots=SEEDS), prompt_ids, "on")
    assert drafted > 0
    assert tokens == reference


@pytest.mark.slow
def test_auto_under_the_goodput_policy_gives_the_text_of_speculation_off(make_engine, prompt_ids, reference):
    built = make_engine("draft", gamma=4, num_slots=SEEDS, load_monitor={"enabled": True})
    tokens, drafted = _run(built, prompt_ids, "auto")
    assert drafted > 0, "the policy planned drafts for seeded rows"
    assert tokens == reference


@pytest.mark.slow
def test_a_draft_that_fails_or_skips_rows_mid_request_changes_nothing(make_engine, prompt_ids, reference):
    built = make_engine("draft", gamma=4, num_slots=SEEDS)
    flaky = built.engine.proposer = FlakyProposer(built.engine.proposer)
    tokens, drafted = _run(built, prompt_ids, "on")
    assert flaky.calls >= 6 and drafted > 0 and built.engine.proposer_failures > 0
    assert tokens == reference
