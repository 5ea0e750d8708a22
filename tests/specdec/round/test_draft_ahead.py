"""Drafting ahead (pipelined rounds) changes when drafts are made, never what is generated.

The engine drafts round k + 1 while the target verifies round k, for the verdicts of round
k the draft finds likeliest (branches: every draft accepted, or a rejection at some position
with the draft's next-best token there); the branch whose verdict happened becomes round
k + 1's drafts, the others are thrown away (rolled back).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.round.draft_ahead import BATCH_BRANCHES, BATCH_WAYS, DraftAhead, step_kind
from specdec.round.look_ahead_depth import LookAheadDepth
from specdec.round.look_ahead_hits import LookAheadHits
from specdec.round.engine import SpeculativeEngine
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import Branch, Drafts
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.requests.request import GenerationRequest
from specdec.round.overlap_choice import EARLY_ROUNDS, LOOK_AHEAD, MICRO_BATCHES, SEQUENTIAL, OverlapChoice
from specdec.sampling.sampling_params import SamplingParams
from specdec.policy.speculation_policy import fixed_plan
from specdec.verifiers.target_verifier import TargetVerifier
from specdec.verifiers.verifier import Verifier, VerifyRequest, VerifyResult
from token_statistics import ALPHA, as_table, p_value, reference_probs


class ConcurrentVerifier(Verifier):
    """An in-process verifier that says it runs concurrently, so the engine drafts ahead
    (here the draft simply runs after the verify call: same logic, no parallelism)."""

    runs_concurrently = True

    def __init__(self, inner: TargetVerifier) -> None:
        self.inner, self.vocab_size, self.max_seq_len = inner, inner.vocab_size, inner.max_seq_len

    @property
    def num_free_slots(self) -> int:
        return self.inner.num_free_slots

    def verify(self, requests):
        return self.inner.verify(requests)

    def release(self, seq_id):
        self.inner.release(seq_id)


def pipelined(num_slots: int = 8, max_seq_len: int = 256, min_acceptance: float = 0.0, gamma: int = 4,
              way: str | None = MICRO_BATCHES, branches: int | None = 3, draft_slots: int | None = None,
              hits: LookAheadHits | None = None, block_rounds: int = 24, explore_every: int = 6,
              depth: LookAheadDepth | None = None):
    """way: every step's (None: measured); draft_slots: the draft's cache (default num_slots
    + 16, room for the look-ahead's forks); depth: default the whole γ (here the verify ends
    before the look-ahead starts, so a measured depth would shrink to one draft)."""
    target = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=num_slots,
                                         max_seq_len=max_seq_len)
    draft = ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=draft_slots or num_slots + 16,
                                        max_seq_len=max_seq_len)
    proposer = DraftModelProposer(draft, target.vocab_size, wire_dtype=torch.float16)
    return SpeculativeEngine(ConcurrentVerifier(TargetVerifier(target)), proposer, gamma=gamma,
                             draft_ahead=DraftAhead(min_acceptance, way, branches, hits, block_rounds, explore_every,
                                                    depth or LookAheadDepth(most_cut=0)))


def target_logits(histories: list[list[int]]) -> np.ndarray:
    """The target's next-token logits after each history, [n, V] float64."""
    runner = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=len(histories), max_seq_len=8)
    slots = [runner.allocate_slot() for _ in histories]
    return runner.forward(slots, histories, last_only=True).double().numpy()


# --- the look-ahead bookkeeping ------------------------------------------------------------


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


# --- through the engine ----------------------------------------------------------------------


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


def conditional_p_value(pairs: list[tuple[int, int]], second: dict[int, dict[int, float]]) -> float:
    """Chi-squared test that x2 follows second[x1] given each observed x1 (the x1 of these
    rows need not follow any particular law): one goodness-of-fit statistic per x1, summed."""
    statistic, dof = 0.0, 0
    for x1 in {x for x, _ in pairs}:
        outcomes = np.array([x2 for x, x2 in pairs if x == x1])
        table = second[x1]
        if any(table.get(int(x2), 0.0) <= 0 for x2 in outcomes):
            return 0.0
        keys = sorted(table)
        observed = np.array([np.sum(outcomes == k) for k in keys], dtype=np.float64)
        expected = np.array([table[k] for k in keys]) * len(outcomes)
        keep = expected >= 5.0
        if keep.sum() < 2:
            continue
        observed = np.append(observed[keep], observed[~keep].sum())
        expected = np.append(expected[keep], expected[~keep].sum())
        nonzero = expected > 0
        statistic += float((((observed - expected) ** 2)[nonzero] / expected[nonzero]).sum())
        dof += int(nonzero.sum()) - 1
    return float(stats.chi2.sf(statistic, dof)) if dof else 1.0


START = 291  # the one-token prompt: after it the draft's next-best token is often the recovered one


class RecordingDraftAhead(DraftAhead):
    """Remembers the rows whose round 1 (the one-token prompt and one draft) had a usable
    look-ahead: all accepted (x3 is verified from a look-ahead draft), or x1 rejected and
    recovered as the branch assumed (x2 is). (Round 2's hits depend on x3 itself: not recorded.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hit_ids: set[str] = set()
        self.rejection_hit_ids: set[str] = set()

    def keep(self, request, result, branches) -> None:
        hits = self.hits
        super().keep(request, result, branches)
        if self.hits > hits and len(request.token_ids) + len(request.draft_token_ids) == 2:
            rejected = result.num_accepted < len(request.draft_token_ids)
            (self.rejection_hit_ids if rejected else self.hit_ids).add(request.seq_id)


def run_rows(params: SamplingParams, micro_batches: bool, chunks: int = 4):
    """Three tokens for each of chunks x 1024 rows at γ = 1; returns their tokens and, per
    row, 3 when its x3 was verified from a look-ahead draft, 2 when its x2 was, else 0."""
    tokens, hit_rows = [], []
    for chunk in range(chunks):
        way = MICRO_BATCHES if micro_batches else LOOK_AHEAD
        engine = pipelined(num_slots=1024, max_seq_len=8, gamma=1, way=way, draft_slots=3 * 1024)
        engine.draft_ahead = RecordingDraftAhead(0.0, way, 3)
        ids = [engine.add_request(GenerationRequest([START], 3,
                                                    dataclasses.replace(params, seed=7_000_000 + chunk * 1024 + i),
                                                    gamma=1, mode="on", ignore_eos=True)) for i in range(1024)]
        while engine.has_unfinished():
            engine.step()
        for seq_id in ids:
            tokens.append(engine.result(seq_id).token_ids)
            recorded = engine.draft_ahead
            hit_rows.append(3 if seq_id in recorded.hit_ids else 2 if seq_id in recorded.rejection_hit_ids else 0)
    return tokens, hit_rows


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.parametrize("micro_batches", [False, True], ids=["look-ahead", "micro-batches"])
def test_tokens_drafted_ahead_follow_the_targets_distribution(micro_batches):
    """γ = 1, three tokens per row. Micro-batches: half the rows are drafted for while the
    other half is verified. Look-ahead: while round 1 verifies x1's draft, the draft branches:
    x1 accepted and bonus x2 one of its two best guesses, each with a draft for x3; or x1
    rejected and recovered as its next-best token, with a draft for x2. Where the verdict
    matches a branch, its draft is verified against the target (accepted, or recovered).
    (x1, x2) must follow p(x1) p(x2 | x1); the rows whose x3 was drafted ahead must follow
    p(x3 | x1, x2) given their (x1, x2), and those whose x2 was, p(x2 | x1) given x1: their q
    must be the draft's q for that token, no other."""
    params = SamplingParams(temperature=1.0, top_k=3)
    p1 = reference_probs(target_logits([[START]])[0], params)
    support = [int(x) for x in np.flatnonzero(p1)]
    vocab = len(p1)
    second = {x1: as_table(reference_probs(logits, params))
              for x1, logits in zip(support, target_logits([[START, x1] for x1 in support]))}
    joint = {x1 * vocab + x2: p1[x1] * p2 for x1 in support for x2, p2 in second[x1].items()}
    tokens, hits = run_rows(params, micro_batches)
    pv = p_value(np.array([t[0] * vocab + t[1] for t in tokens]), joint)
    assert pv > ALPHA / 2, f"joint chi-squared p-value {pv:.2e} over {len(tokens)} rows"
    if micro_batches:
        return
    after_rejection = [t for t, hit in zip(tokens, hits) if hit == 2]
    assert len(after_rejection) > 0.05 * len(tokens), f"x2 must often be drafted ahead ({len(after_rejection)} rows)"
    pv = conditional_p_value([(t[0], t[1]) for t in after_rejection], second)
    assert pv > ALPHA / 2, f"rows drafted ahead after a rejection: chi-squared p-value {pv:.2e}"
    ahead = [t for t, hit in zip(tokens, hits) if hit == 3]
    assert len(ahead) > 0.15 * len(tokens), f"x3 must often be drafted ahead ({len(ahead)} rows)"
    prefixes = sorted({(t[0], t[1]) for t in ahead})
    third = {pair: as_table(reference_probs(logits, params))
             for pair, logits in zip(prefixes, target_logits([[START, *pair] for pair in prefixes]))}
    pv = conditional_p_value([((t[0], t[1]), t[2]) for t in ahead], third)
    assert pv > ALPHA / 2, f"drafted-ahead rows: chi-squared p-value {pv:.2e} over {len(ahead)} rows"


def test_admission_counts_rows_not_verified_yet_as_holding_their_target_slot(prompt_ids, hf_greedy):
    """With micro-batches a newly admitted row is first verified a step later; more requests
    than slots must still never be admitted (the target would run out of cache)."""
    engine = pipelined(num_slots=3)
    results = engine.generate([GenerationRequest(p, 12) for p in prompt_ids[:7]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 12) for p in prompt_ids[:7]]
    assert engine.draft_ahead.stored > 0


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
