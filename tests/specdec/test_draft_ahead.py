"""Drafting ahead (pipelined rounds) changes when drafts are made, never what is generated.

The engine drafts round k + 1 while the target verifies round k, assuming every draft of
round k is accepted; the look-ahead is used only where that held and its first token equals
the target's final token, and thrown away (rolled back) everywhere else.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.draft_ahead import DraftAhead
from specdec.engine import SpeculativeEngine
from specdec.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import Proposal
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.request import GenerationRequest
from specdec.sampling_params import SamplingParams
from specdec.target_verifier import TargetVerifier
from specdec.verifier import Verifier, VerifyRequest, VerifyResult
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
              micro_batches: bool = True):
    target = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=num_slots, max_seq_len=max_seq_len)
    draft = ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=num_slots, max_seq_len=max_seq_len)
    proposer = DraftModelProposer(draft, target.vocab_size, wire_dtype=torch.float16)
    return SpeculativeEngine(ConcurrentVerifier(TargetVerifier(target)), proposer, gamma=gamma,
                             draft_ahead=DraftAhead(min_acceptance, micro_batches))


def target_logits(histories: list[list[int]]) -> np.ndarray:
    """The target's next-token logits after each history, [n, V] float64."""
    runner = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=len(histories), max_seq_len=8)
    slots = [runner.allocate_slot() for _ in histories]
    return runner.forward(slots, histories, last_only=True).double().numpy()


# --- the look-ahead bookkeeping ------------------------------------------------------------


def _proposal(rows: list[list[int]]) -> Proposal:
    width = max(len(r) for r in rows)
    p = Proposal.empty(len(rows), width)
    for i, r in enumerate(rows):
        p.token_ids[i, : len(r)] = torch.tensor(r)
        p.num_drafted[i] = len(r)
    return p


def test_a_look_ahead_is_kept_only_when_every_draft_was_accepted_and_its_first_token_was_right():
    ahead = DraftAhead()
    request = VerifyRequest("a", [1, 2], [3, 4], SamplingParams())
    look = _proposal([[5, 6, 7]])  # guesses: final token 5, then drafts 6, 7
    ahead.keep(request, VerifyResult("a", [3, 4, 5], 2), look, 0)
    assert ahead.take("a", [1, 2, 3, 4, 5], gamma=4) == ([6, 7], None)
    ahead.keep(request, VerifyResult("a", [3, 4, 9], 2), look, 0)  # the final token differs
    ahead.keep(dataclasses.replace(request, seq_id="b"), VerifyResult("b", [3, 8], 1), look, 0)  # a rejection
    assert ahead.take("a", [1, 2, 3, 4, 9], 4) == ([], None) and ahead.take("b", [1, 2, 3, 8], 4) == ([], None)
    assert ahead.hits == 1


def test_a_look_ahead_is_cut_to_the_rows_gamma_and_used_once():
    ahead = DraftAhead()
    ahead.keep(VerifyRequest("a", [1], [], SamplingParams()), VerifyResult("a", [5], 0), _proposal([[5, 6, 7, 8]]), 0)
    assert ahead.take("a", [1, 5], gamma=2) == ([6, 7], None)
    assert ahead.take("a", [1, 5], gamma=2) == ([], None)


def test_rows_with_low_acceptance_stop_drafting_ahead():
    ahead = DraftAhead(min_acceptance=0.3)
    assert ahead.wants(drafted=0, accepted=0, rounds=0)
    assert ahead.wants(drafted=40, accepted=2, rounds=3), "too early to judge"
    assert not ahead.wants(drafted=40, accepted=2, rounds=10)
    assert ahead.wants(drafted=40, accepted=20, rounds=10)


# --- through the engine ----------------------------------------------------------------------


def test_a_lone_request_looks_ahead_and_keeps_the_targets_greedy_output(prompt_ids, hf_greedy):
    engine = pipelined()
    [result] = engine.generate([GenerationRequest(prompt_ids[0], 48, ignore_eos=True)])
    assert result.token_ids == hf_greedy(prompt_ids[0], 48)
    ahead = engine.draft_ahead
    assert 0 < ahead.hits < ahead.rows_ahead, "some look-aheads were used, others rolled back"
    assert engine.stats.accepted > 0


def test_two_micro_batches_take_turns_and_keep_the_targets_greedy_output(prompt_ids, hf_greedy):
    """With several requests, one half is verified while the other half is drafted for."""
    engine = pipelined()
    results = engine.generate([GenerationRequest(p, 32, ignore_eos=True) for p in prompt_ids[:5]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 32) for p in prompt_ids[:5]]
    assert engine.draft_ahead.stored > 0 and engine.stats.accepted > 0
    assert engine.profile.rounds > max(r.stats.rounds for r in results), "each step verified a part of the batch"


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


class RecordingDraftAhead(DraftAhead):
    """Remembers which rows' third token will be verified from a look-ahead draft: the
    look-ahead made in round 1 (whose history is the one-token prompt and one draft) was
    right. (Round 2's look-ahead hits depend on the third token itself: not recorded.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hit_ids: set[str] = set()

    def keep(self, request, result, proposal, row) -> None:
        hits = self.hits
        super().keep(request, result, proposal, row)
        if self.hits > hits and len(request.token_ids) + len(request.draft_token_ids) == 2:
            self.hit_ids.add(request.seq_id)


def run_rows(params: SamplingParams, micro_batches: bool, chunks: int = 4):
    """Three tokens for each of chunks x 1024 rows at γ = 1; returns their tokens and the
    ids of rows whose third token was verified from a look-ahead draft."""
    tokens, hit_rows = [], []
    for chunk in range(chunks):
        engine = pipelined(num_slots=1024, max_seq_len=8, gamma=1, micro_batches=micro_batches)
        engine.draft_ahead = RecordingDraftAhead(0.0, micro_batches)
        ids = [engine.add_request(GenerationRequest([481], 3, dataclasses.replace(params, seed=7_000_000 + chunk * 1024 + i),
                                                    gamma=1, mode="on", ignore_eos=True)) for i in range(1024)]
        while engine.has_unfinished():
            engine.step()
        for seq_id in ids:
            tokens.append(engine.result(seq_id).token_ids)
            hit_rows.append(seq_id in engine.draft_ahead.hit_ids)
    return tokens, hit_rows


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.parametrize("micro_batches", [False, True], ids=["look-ahead", "micro-batches"])
def test_tokens_drafted_ahead_follow_the_targets_distribution(micro_batches):
    """γ = 1, three tokens per row. Micro-batches: half the rows are drafted for while the
    other half is verified. Look-ahead: while round 1 verifies x1's draft, the draft guesses
    the round's bonus x2 (e0) and drafts x3 after it; where x1 was accepted and e0 == x2, x3
    is that look-ahead draft verified against the target (accepted, or recovered).
    (x1, x2) must follow p(x1) p(x2 | x1); the rows whose x3 was drafted ahead must follow
    p(x3 | x1, x2) given their (x1, x2): their q must be the draft's q for x3, no other."""
    params = SamplingParams(temperature=1.0, top_k=3)
    p1 = reference_probs(target_logits([[481]])[0], params)
    support = [int(x) for x in np.flatnonzero(p1)]
    vocab = len(p1)
    second = {x1: as_table(reference_probs(logits, params))
              for x1, logits in zip(support, target_logits([[481, x1] for x1 in support]))}
    joint = {x1 * vocab + x2: p1[x1] * p2 for x1 in support for x2, p2 in second[x1].items()}
    tokens, hits = run_rows(params, micro_batches)
    pv = p_value(np.array([t[0] * vocab + t[1] for t in tokens]), joint)
    assert pv > ALPHA / 2, f"joint chi-squared p-value {pv:.2e} over {len(tokens)} rows"
    if micro_batches:
        return
    ahead = [t for t, hit in zip(tokens, hits) if hit]
    assert len(ahead) > 0.15 * len(tokens), f"x3 must often be drafted ahead ({len(ahead)} rows)"
    prefixes = sorted({(t[0], t[1]) for t in ahead})
    third = {pair: as_table(reference_probs(logits, params))
             for pair, logits in zip(prefixes, target_logits([[481, *pair] for pair in prefixes]))}
    pv = conditional_p_value([((t[0], t[1]), t[2]) for t in ahead], third)
    assert pv > ALPHA / 2, f"drafted-ahead rows: chi-squared p-value {pv:.2e} over {len(ahead)} rows"


def test_admission_counts_rows_not_verified_yet_as_holding_their_target_slot(prompt_ids, hf_greedy):
    """With micro-batches a newly admitted row is first verified a step later; more requests
    than slots must still never be admitted (the target would run out of cache)."""
    engine = pipelined(num_slots=3)
    results = engine.generate([GenerationRequest(p, 12) for p in prompt_ids[:7]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 12) for p in prompt_ids[:7]]
    assert engine.draft_ahead.stored > 0
