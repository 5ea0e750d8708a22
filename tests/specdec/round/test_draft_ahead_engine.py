"""Drafting ahead (pipelined rounds) through the engine changes when drafts are made, never
what is generated: every way (a look-ahead with its branches, two micro-batches, the measured
choice) keeps the target's greedy output and a seeded request's tokens."""

from __future__ import annotations

import pytest

from specdec.round.look_ahead_depth import LookAheadDepth
from specdec.round.look_ahead_hits import LookAheadHits
from specdec.requests.request import GenerationRequest
from specdec.round.overlap_choice import LOOK_AHEAD, SEQUENTIAL
from specdec.sampling.sampling_params import SamplingParams
from specdec.policy.speculation_policy import fixed_plan
from pipelined_engines import pipelined


@pytest.mark.parametrize("branches", [1, 4])
def test_a_lone_request_looks_ahead_and_keeps_the_targets_greedy_output(prompt_ids, hf_greedy, branches):
    engine = pipelined(branches=branches)
    [result] = engine.generate([GenerationRequest(prompt_ids[0], 48, ignore_eos=True)])
    assert result.token_ids == hf_greedy(prompt_ids[0], 48)
    ahead = engine.draft_ahead
    assert 0 < ahead.hits < ahead.rows_ahead, "some look-aheads were used, others rolled back"
    assert engine.stats.accepted > 0
    if branches > 1:
        assert ahead.rejection_hits > 0, "some rounds after a rejection had their drafts ready"
    else:
        assert ahead.rejection_hits == 0


def test_a_row_gated_off_after_a_missed_look_ahead_keeps_drafting_and_the_targets_greedy_output(
        prompt_ids, hf_greedy):
    """The row is gated off after its first rounds (min_acceptance 0.6): before, a row
    whose last look-ahead had missed then verified one token per round, without drafts, to
    its end; now only rounds before the gate verify plainly."""
    engine = pipelined(way=LOOK_AHEAD, branches=1, min_acceptance=0.6)
    [result] = engine.generate([GenerationRequest(prompt_ids[0], 48, ignore_eos=True)])
    assert result.token_ids == hf_greedy(prompt_ids[0], 48)
    assert engine.draft_ahead.plain_rounds <= 4
    assert engine.stats.drafted > 2 * engine.stats.rounds, "the gated rounds carry drafts"


def test_a_look_ahead_drafts_the_branches_that_hit_and_keeps_the_targets_greedy_output(prompt_ids, hf_greedy):
    """Branches not given: every look-ahead drafts all `most` branches until each position's
    hit rate is measured, then only up to the last one that hits often enough (the bundled
    draft hits after rejections too, so some rejection branches stay)."""
    hits = LookAheadHits(most=6, warmup=4, probe_every=1000)
    engine = pipelined(way=LOOK_AHEAD, branches=None, hits=hits)
    [result] = engine.generate([GenerationRequest(prompt_ids[0], 64, ignore_eos=True)])
    assert result.token_ids == hf_greedy(prompt_ids[0], 64)
    ahead = engine.draft_ahead
    assert hits.seen[0] == ahead.rows_ahead and hits.seen[0] > hits.seen[5], "branch 6 was dropped after warm-up"
    assert hits.branches() == 1 + max(p for p in range(6) if hits.worth(p))
    assert ahead.rejection_hits > 0


def test_a_look_ahead_that_outlasts_the_verify_drafts_less_and_keeps_the_targets_greedy_output(prompt_ids, hf_greedy):
    """Here the verify has ended before the look-ahead starts (no slack at all), so every 4
    look-aheads the depth drops by one draft, down to one."""
    depth = LookAheadDepth(settle=4)
    engine = pipelined(way=LOOK_AHEAD, branches=1, depth=depth)
    [result] = engine.generate([GenerationRequest(prompt_ids[0], 48, ignore_eos=True)])
    assert result.token_ids == hf_greedy(prompt_ids[0], 48)
    assert engine.draft_ahead.rows_ahead >= 12 and depth.depth(4) == 1 and depth.slack_s < depth.step_s / 4


def test_branching_on_rejections_makes_more_look_aheads_usable(prompt_ids):
    """Both runs see the same rounds (greedy): branches for a rejection at the drafted
    positions turn some of the rounds that rejected a draft into rounds whose next drafts
    were ready."""
    rates = []
    for branches in (1, 4):
        engine = pipelined(branches=branches)
        engine.generate([GenerationRequest(p, 48, ignore_eos=True) for p in prompt_ids[:1]])
        rates.append(engine.draft_ahead.hit_rate)
    assert rates[1] > rates[0] + 0.1, rates


def test_two_micro_batches_take_turns_and_keep_the_targets_greedy_output(prompt_ids, hf_greedy):
    """With several requests, one half is verified while the other half is drafted for."""
    engine = pipelined()
    results = engine.generate([GenerationRequest(p, 32, ignore_eos=True) for p in prompt_ids[:5]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 32) for p in prompt_ids[:5]]
    assert engine.draft_ahead.stored > 0 and engine.stats.accepted > 0
    assert engine.profile.rounds > max(r.stats.rounds for r in results), "each step verified a part of the batch"


def test_steps_of_several_rows_start_with_sequential_rounds_and_a_lone_row_looks_ahead(prompt_ids, hf_greedy):
    """Measured choice, one per kind of step: three requests together run sequential rounds
    until measured otherwise (no extra draft work); the last one left alone looks ahead."""
    engine = pipelined(way=None, block_rounds=1000)
    jobs = [(prompt_ids[0], 12), (prompt_ids[1], 12), (prompt_ids[2], 40)]
    results = engine.generate([GenerationRequest(p, n, ignore_eos=True) for p, n in jobs])
    assert [r.token_ids for r in results] == [hf_greedy(p, n) for p, n in jobs]
    alone = results[2].stats.rounds - max(r.stats.rounds for r in results[:2])
    ahead = engine.draft_ahead
    assert 0 < ahead.rows_ahead <= alone and ahead.stored == 0, "only the steps with one row looked ahead"
    assert ahead.choices[(2, "greedy")].way == SEQUENTIAL and ahead.choices[(1, "greedy")].way == LOOK_AHEAD


def test_a_measured_choice_runs_blocks_with_and_without_looking_ahead_and_keeps_the_output(prompt_ids, hf_greedy):
    """Blocks of 4 rounds: a lone request's first block looks ahead, the second runs
    sequential rounds, then the faster way by the measured tokens per second. Rounds of
    two requests are a kind of their own; the prefill round is not counted; the output is
    the target's greedy output either way."""
    engine = pipelined(way=None, block_rounds=4, explore_every=2)
    jobs = [(prompt_ids[0], 8), (prompt_ids[1], 64)]
    results = engine.generate([GenerationRequest(p, n, ignore_eos=True) for p, n in jobs])
    assert [r.token_ids for r in results] == [hf_greedy(p, n) for p, n in jobs]
    lone = engine.draft_ahead.choices[(1, "greedy")]
    assert None not in lone.rates.values(), "both ways were measured"
    ahead = engine.draft_ahead
    alone = results[1].stats.rounds - results[0].stats.rounds - 1  # the lone request's rounds, after its prefill
    assert 0 < ahead.rows_ahead < alone, "some of the lone request's rounds looked ahead, others did not"


def test_several_rows_measure_all_three_ways_and_keep_the_targets_greedy_output(prompt_ids, hf_greedy):
    """Blocks of 2 rounds among four greedy requests: sequential rounds, looking ahead and
    micro-batches are each measured; the sampled kind is not (none ran)."""
    engine = pipelined(way=None, block_rounds=2, explore_every=1)
    results = engine.generate([GenerationRequest(p, 40, ignore_eos=True) for p in prompt_ids[:4]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 40) for p in prompt_ids[:4]]
    ahead = engine.draft_ahead
    assert None not in ahead.choices[(4, "greedy")].rates.values()
    assert ahead.stored > 0 and ahead.rows_ahead > 0
    assert all(kind[1] == "greedy" for kind in ahead.choices)


class RecordingPolicy:
    """The static plan, keeping every round's measurements."""

    def __init__(self) -> None:
        self.samples = []

    def on_arrival(self, count: int = 1) -> None: ...

    def set_load(self, in_flight: int, queued: int) -> None: ...

    def plan(self, rows, default_gamma):
        return fixed_plan(rows, default_gamma)

    def record(self, sample) -> None:
        self.samples.append(sample)


def test_the_policy_sees_no_draft_call_in_rounds_whose_drafts_were_made_ahead(prompt_ids):
    """The cost model learns what a proposer call costs the round it waits for: a round that
    verifies drafts made during the previous verify has none (asked γ 0, no draft time),
    though its drafted tokens still count for acceptance."""
    engine = pipelined()
    engine.policy = RecordingPolicy()
    engine.generate([GenerationRequest(prompt_ids[0], 48, ignore_eos=True)])
    ahead_rounds = [s for s in engine.policy.samples if s.drafted and not s.draft_rows]
    hits = engine.draft_ahead.hits  # each used by the next round, but perhaps the last (the request ended)
    assert hits > 0 and hits - 1 <= len(ahead_rounds) <= hits
    fresh_rounds = [s for s in engine.policy.samples if s not in ahead_rounds and s.drafted]
    assert all(s.draft_rows == 1 and s.gamma > 0 and s.draft_seconds > 0 for s in fresh_rounds)
    slowest_take = max(s.draft_seconds for s in ahead_rounds)  # taking drafts made ahead, no forward
    assert all(s.gamma == 0 for s in ahead_rounds) and slowest_take < min(s.draft_seconds for s in fresh_rounds) / 2


def test_a_seeded_sampled_request_repeats_exactly_when_drafting_ahead(prompt_ids):
    request = GenerationRequest(prompt_ids[1], 32, SamplingParams(temperature=0.9, top_p=0.95, seed=8), ignore_eos=True)
    first, second = (pipelined().generate([request])[0] for _ in range(2))
    assert first.token_ids == second.token_ids


def test_admission_counts_rows_not_verified_yet_as_holding_their_target_slot(prompt_ids, hf_greedy):
    """With micro-batches a newly admitted row is first verified a step later; more requests
    than slots must still never be admitted (the target would run out of cache)."""
    engine = pipelined(num_slots=3)
    results = engine.generate([GenerationRequest(p, 12) for p in prompt_ids[:7]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 12) for p in prompt_ids[:7]]
    assert engine.draft_ahead.stored > 0
