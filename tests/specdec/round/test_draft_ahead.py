"""Drafting ahead's bookkeeping (pure, on fake rows): which branch becomes the next round's
drafts, missed rows, rows gated off by acceptance, and how each kind of step chooses its way
(sequential rounds, a look-ahead, micro-batches) and its number of branches.

The engine drafts round k + 1 while the target verifies round k, for the verdicts of round
k the draft finds likeliest (branches: every draft accepted, or a rejection at some position
with the draft's next-best token there); the branch whose verdict happened becomes round
k + 1's drafts, the others are thrown away (rolled back).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from specdec.round.draft_ahead import BATCH_BRANCHES, BATCH_WAYS, DraftAhead, step_kind
from specdec.round.look_ahead_hits import LookAheadHits
from specdec.proposers.base import Branch, Drafts
from specdec.round.overlap_choice import EARLY_ROUNDS, LOOK_AHEAD, MICRO_BATCHES, SEQUENTIAL, OverlapChoice
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import VerifyRequest, VerifyResult


def test_the_branch_whose_verdict_happened_becomes_the_next_rounds_drafts():
    ahead = DraftAhead()
    request = VerifyRequest("a", [1, 2], [3, 4], SamplingParams())  # history [1, 2], drafts 3 and 4
    branches = [Branch(4, 5, [6, 7]),  # both accepted, then bonus 5
                Branch(3, 9, [10, 11]),  # 3 accepted, 4 rejected: the target emits 9
                Branch(2, 8, [12])]  # 3 rejected: the target emits 8
    ahead.keep(request, VerifyResult("a", [3, 4, 5], 2), branches)
    assert ahead.take("a", [1, 2, 3, 4, 5], gamma=4) == Drafts([6, 7])
    ahead.keep(request, VerifyResult("a", [3, 9], 1), branches)
    assert ahead.take("a", [1, 2, 3, 9], gamma=4) == Drafts([10, 11])
    ahead.keep(request, VerifyResult("a", [3, 4, 13], 2), branches)  # a bonus token no branch guessed
    ahead.keep(dataclasses.replace(request, seq_id="b"), VerifyResult("b", [7], 0), branches)  # 7, not 8
    assert ahead.take("a", [1, 2, 3, 4, 13], 4) == Drafts() and ahead.take("b", [1, 2, 7], 4) == Drafts()
    assert (ahead.hits, ahead.rejection_hits) == (2, 1)


def test_a_look_ahead_is_cut_to_the_rows_gamma_and_used_once():
    ahead = DraftAhead()
    ahead.keep(VerifyRequest("a", [1], [], SamplingParams()), VerifyResult("a", [5], 0), [Branch(1, 5, [6, 7, 8])])
    assert ahead.take("a", [1, 5], gamma=2) == Drafts([6, 7])
    assert ahead.take("a", [1, 5], gamma=2) == Drafts()


def row(seq_id: str, rounds: int = 3, drafted: int = 0, accepted: int = 0) -> SimpleNamespace:
    """A row as DraftAhead reads it: its id and its own acceptance so far."""
    return SimpleNamespace(seq_id=seq_id, stats=SimpleNamespace(rounds=rounds, drafted=drafted, accepted=accepted))


def test_a_row_whose_look_ahead_missed_verifies_without_drafts_while_its_step_looks_ahead():
    """Rather than wait for a fresh proposal, the round verifies the missed row plainly (one
    token, the target's) and its next drafts are drafted during that verify; a sequential
    step proposes as usual, and a hit, or a row that left, ends it."""
    ahead = DraftAhead(way=LOOK_AHEAD)
    request = VerifyRequest("a", [1, 2], [3, 4], SamplingParams())
    ahead.keep(request, VerifyResult("a", [3, 9], 1), [Branch(4, 5, [6, 7])])  # a miss
    ahead.split([SimpleNamespace(**vars(row("a")), request=None)], {"a": 0})
    assert ahead.verifies_plainly(row("a")) and not ahead.verifies_plainly(row("b"))
    ahead._step = (SEQUENTIAL, None, None)
    assert not ahead.verifies_plainly(row("a")), "a sequential step proposes for it"
    ahead._step = (LOOK_AHEAD, None, None)
    ahead.keep(request, VerifyResult("a", [3, 4, 5], 2), [Branch(4, 5, [6, 7])])  # a hit
    assert not ahead.verifies_plainly(row("a"))
    ahead.keep(request, VerifyResult("a", [8], 0), [Branch(4, 5, [6, 7])])
    ahead.forget("a")
    assert not ahead.verifies_plainly(row("a")) and ahead.plain_rounds == 1
    assert not DraftAhead(way=LOOK_AHEAD, plain_misses=False).verifies_plainly(row("a"))


def test_a_missed_row_that_stops_looking_ahead_is_proposed_for_again():
    """A row gated off by its acceptance after a miss would verify one token at a time for
    the rest of its request (no look-ahead ever hits again, so its miss mark stayed): it is
    proposed for instead, and a step that does not look ahead for it clears its mark."""
    ahead = DraftAhead(min_acceptance=0.3, way=LOOK_AHEAD)
    request = VerifyRequest("a", [1, 2], [3, 4], SamplingParams())
    ahead.keep(request, VerifyResult("a", [3, 9], 1), [Branch(4, 5, [6, 7])])  # a miss
    ahead._step = (LOOK_AHEAD, None, None)
    gated = SimpleNamespace(**vars(row("a", rounds=10, drafted=40, accepted=2)), token_ids=[1, 2], grammar=None,
                            request=SimpleNamespace(sampling=SamplingParams(), proposer=None),
                            num_prompt_tokens=2, reserve_tokens=8)
    assert not ahead.verifies_plainly(gated), "not worth a look-ahead: proposed for"
    assert ahead.verifies_plainly(row("a", rounds=10, drafted=40, accepted=20))
    asks = ahead.asks([gated], [], [request], {"a": 4})
    assert [ask.gamma for ask in asks] == [0]
    assert not ahead.verifies_plainly(row("a", rounds=10, drafted=40, accepted=20)), "no look-ahead: no miss"


def test_a_sequential_step_clears_a_missed_rows_mark():
    """A row's miss mark is about its last look-ahead: after a sequential (or micro-batch)
    step verified it, the first step that looks ahead again proposes for it as usual instead
    of verifying one token plainly (before, the mark survived the sequential steps)."""
    ahead = DraftAhead(way=LOOK_AHEAD)
    batch = fake_rows(1)
    ahead.keep(VerifyRequest("0", [5, 6], [3, 4], SamplingParams()), VerifyResult("0", [3, 9], 1),
               [Branch(4, 5, [6, 7])])  # a miss
    for way in (SEQUENTIAL, MICRO_BATCHES):
        ahead.split(batch, {"0": 4})
        assert ahead.verifies_plainly(batch[0]), "looking ahead again right after the miss: plain"
        ahead.way = way
        ahead.split(batch, {"0": 4})
        assert not ahead.verifies_plainly(batch[0])
        ahead.way = LOOK_AHEAD
        ahead.split(batch, {"0": 4})
        assert not ahead.verifies_plainly(batch[0]), f"the {way} step cleared the mark"
        ahead.keep(VerifyRequest("0", [5, 6], [3, 4], SamplingParams()), VerifyResult("0", [3, 9], 1),
                   [Branch(4, 5, [6, 7])])
    assert ahead.plain_rounds == 2


def test_rows_with_low_acceptance_stop_drafting_ahead():
    ahead = DraftAhead(min_acceptance=0.3)
    assert ahead.wants(drafted=0, accepted=0, rounds=0)
    assert ahead.wants(drafted=40, accepted=2, rounds=3), "too early to judge"
    assert not ahead.wants(drafted=40, accepted=2, rounds=10)
    assert ahead.wants(drafted=40, accepted=20, rounds=10)


# --- how a kind of step chooses its way ----------------------------------------------------


def test_a_lone_row_drafts_every_branch_and_several_rows_at_most_batch_branches_each():
    """A lone row's look-ahead branches on the draft's 2nd and 3rd choices; when several rows
    look ahead together, each branch is one more row of the draft's forward."""
    def rows(n):
        return [SimpleNamespace(seq_id=str(i), token_ids=[5, 6, 7], num_prompt_tokens=2, reserve_tokens=0, grammar=None,
                                request=SimpleNamespace(sampling=SamplingParams(), proposer=None),
                                stats=SimpleNamespace(drafted=0, accepted=0, rounds=1)) for i in range(n)]

    for n, expected in ((1, 12), (3, BATCH_BRANCHES)):
        ahead = DraftAhead(way=LOOK_AHEAD, hits=LookAheadHits(most=12))
        batch = rows(n)
        gammas = {seq.seq_id: 4 for seq in batch}
        now, later = ahead.split(batch, gammas)
        requests = [SimpleNamespace(token_ids=seq.token_ids, draft_token_ids=[8, 9]) for seq in now]
        asks = ahead.asks(now, later, requests, gammas)
        assert [ask.gamma for ask in asks] == [4] * n and ahead.branches == expected


def fake_rows(n: int, greedy: bool = True) -> list:
    """n speculating rows past their first round, for the pure bookkeeping of DraftAhead."""
    sampling = SamplingParams() if greedy else SamplingParams(temperature=0.8)
    return [SimpleNamespace(seq_id=str(i), token_ids=[5, 6, 7], num_prompt_tokens=2, reserve_tokens=0, grammar=None,
                            request=SimpleNamespace(sampling=sampling, proposer=None),
                            stats=SimpleNamespace(drafted=0, accepted=0, rounds=1)) for i in range(n)]


def test_a_new_number_of_rows_starts_from_what_the_nearest_one_measured():
    """The ways' rates over sequential rounds measured with 8 rows: 16 rows try micro-batches
    first and do not measure the look-ahead that lost; a lone row and sampled rows are their
    own cases."""
    ahead = DraftAhead()
    ahead.choices[(8, "greedy")] = OverlapChoice(
        BATCH_WAYS, rates={SEQUENTIAL: 100.0, LOOK_AHEAD: 80.0, MICRO_BATCHES: 120.0})
    for n, greedy, way, presumed in ((16, True, MICRO_BATCHES, {LOOK_AHEAD: 0.8, MICRO_BATCHES: 1.2}),
                                     (1, True, LOOK_AHEAD, {}), (16, False, SEQUENTIAL, {})):
        batch = fake_rows(n, greedy)
        ahead.split(batch, {seq.seq_id: 4 for seq in batch})
        choice = ahead.choices[step_kind(batch)]
        assert choice.way == way
        others = {w: r for w, r in choice.presumed.items() if r is not None and w != SEQUENTIAL}
        assert others == pytest.approx(presumed)


def test_a_step_is_timed_from_where_the_last_one_ended_unless_the_engine_was_idle():
    """The engine's own work between two steps belongs to the step (micro-batches run twice
    as many); a gap longer than the round itself is idle time and is not counted."""
    ahead = DraftAhead(way=None, block_rounds=3)
    clock = iter([1.0, 1.015, 5.0])
    ahead.clock = lambda: next(clock)
    batch = fake_rows(2)
    for _ in range(3):
        ahead.split(batch, {seq.seq_id: 4 for seq in batch})
        assert not ahead.overlaps, "several rows start with sequential rounds (verified in the caller's thread)"
        ahead.round_done(3, 0.01)
    assert ahead.choices[(2, "greedy")].rates[SEQUENTIAL] == pytest.approx(9 / (0.01 + 0.015 + 0.01))


def test_a_micro_batch_exploration_clearly_slower_than_sequential_rounds_ends_early():
    """Eight rows, sequential rounds kept (24 tokens in 20 ms); micro-batch steps verify half
    the rows, which emit what a sequential round would for them, but take as long as a whole
    round: the exploration ends after its first (uncounted) step and EARLY_ROUNDS more, not
    after its whole third of a block (served, several rows' micro-batches lose by a third)."""
    ahead = DraftAhead(way=None, block_rounds=24, explore_every=100)
    ahead.clock = lambda: 0.0  # no time between steps
    ahead.choices[(8, "greedy")] = OverlapChoice(BATCH_WAYS, block_rounds=24, explore_every=100,
                                                 rates={LOOK_AHEAD: 50.0})  # the look-ahead measured, slower
    batch = fake_rows(8)
    gammas = {seq.seq_id: 4 for seq in batch}

    def step() -> str:
        now, later = ahead.split(batch, gammas)
        way = ahead._step[0]
        ahead.round_done(3 * len(now), 0.02, [(4, 4, 2)] * len(now))
        return way

    assert [step() for _ in range(24)] == [SEQUENTIAL] * 24
    explored = 0
    while step() == MICRO_BATCHES:
        explored += 1
    assert explored == 1 + EARLY_ROUNDS
    assert ahead.choices[(8, "greedy")].rates[MICRO_BATCHES] == pytest.approx(12 / 0.02)
