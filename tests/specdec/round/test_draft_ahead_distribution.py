"""Tokens drafted ahead follow the target's distribution: the rows whose tokens were verified
from a look-ahead's branch, or a micro-batch's drafts, are tested against the target's own
conditional probabilities (chi-squared, the statistical tier)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from specdec.round.draft_ahead import DraftAhead
from specdec.requests.request import GenerationRequest
from specdec.round.overlap_choice import LOOK_AHEAD, MICRO_BATCHES
from specdec.sampling.sampling_params import SamplingParams
from token_statistics import ALPHA, as_table, p_value, reference_probs
from pipelined_engines import pipelined, target_logits


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
