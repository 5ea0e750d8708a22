"""Rejection sampling is lossless: emitted tokens follow the processed target distribution.

This file tests the standard rule (every batch here is `standard_rule`: its fixed seeds
only make runs repeatable); the coupled rule of seeded requests is tested in
test_coupled_sampling_statistics.py.

Setting: small vocabularies and fixed, context-independent distributions per position -
the target's p_k at positions k = 1 .. gamma + 1 and the draft's q_k at k = 1 .. gamma,
different at every position. Each batch row is one independent round (its own seed).
Conditioned on the round reaching position k, the token emitted there (accepted,
recovered or bonus) must be distributed as p_k; and the drafted token at a reached
position k is accepted with probability sum(min(p_k, q_k)).

The expected p and q come from `reference_probs`, a numpy implementation of temperature,
top-k and top-p written from their definitions, independent of specdec.sampling.sampling. Checks
are chi-squared goodness-of-fit tests over >= 100k rounds with fixed seeds (so every run
draws the same numbers); each test holds its checks to a family-wise ALPHA (Bonferroni).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.sampling.counter_rng import ROLE_FINAL, as_seeds, uniforms
from specdec.sampling.rejection_sampler import RejectionOutput, rejection_sample
from specdec.sampling.sampling import SamplingBatch, sample_from_probs
from specdec.sampling.sampling_params import SamplingParams
from sampling_rules import standard_rule

pytestmark = pytest.mark.statistical

ROUNDS = 100_000
VOCAB = 10
GAMMA = 3
ALPHA = 1e-4  # family-wise error rate of each test
MIN_EXPECTED = 5.0


# --- independent reference and goodness of fit ------------------------------------------


def reference_probs(logits: np.ndarray, params: SamplingParams, top_p_exact: bool = True) -> np.ndarray:
    """Processed probabilities of logits [..., V] (float64 numpy), from the definitions:
    greedy = one-hot at the argmax; otherwise softmax(logits / T); top-k keeps the k
    largest logits (and every token tied with the k-th), renormalised; top-p then keeps
    the smallest set of most likely tokens whose mass reaches top_p (at least one, and
    every token tied with the last one kept), renormalised.

    top_p_exact=False is a deliberately wrong variant (drops the token that crosses top_p)."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim > 1:
        return np.array([reference_probs(row, params, top_p_exact) for row in logits]).reshape(logits.shape)
    if params.temperature == 0:
        return np.eye(len(logits))[np.argmax(logits)]
    x = logits / params.temperature
    if params.top_k:
        kth = np.sort(x)[::-1][min(params.top_k, len(x)) - 1]
        x = np.where(x >= kth, x, -np.inf)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        ordered = np.sort(probs)[::-1]
        mass = np.cumsum(ordered)
        assert np.abs(mass - params.top_p).min() > 1e-9, "top_p sits on a cumulative sum: ambiguous"
        kept = int(np.argmax(mass >= params.top_p)) + (1 if top_p_exact else 0)
        probs = np.where(probs >= ordered[max(kept, 1) - 1], probs, 0.0)
        probs /= probs.sum()
    return probs


def p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-squared goodness of fit of token counts [V] to probabilities [V]; 0.0 when a
    token of zero probability was observed. Cells expected fewer than MIN_EXPECTED times
    are pooled into one cell (folded into the largest cell when still too small)."""
    counts, probs = np.asarray(counts, dtype=np.float64), np.asarray(probs, dtype=np.float64)
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs / probs.sum() * counts.sum()
    small, keep = (probs > 0) & (expected < MIN_EXPECTED), expected >= MIN_EXPECTED
    obs_cells, exp_cells = list(counts[keep]), list(expected[keep])
    if small.any():
        pooled = (counts[small].sum(), expected[small].sum())
        if pooled[1] >= MIN_EXPECTED or not exp_cells:
            obs_cells.append(pooled[0])
            exp_cells.append(pooled[1])
        else:
            largest = int(np.argmax(exp_cells))
            obs_cells[largest] += pooled[0]
            exp_cells[largest] += pooled[1]
    if len(obs_cells) < 2:
        return 1.0  # a single possible outcome: nothing to test beyond the zero cells
    return float(stats.chisquare(obs_cells, exp_cells).pvalue)


def assert_follows(tokens: torch.Tensor, probs: np.ndarray, alpha: float, what: str) -> None:
    counts = np.bincount(tokens.numpy(), minlength=len(probs))
    p = p_value(counts, probs)
    assert p > alpha, f"{what}: chi-squared p-value {p:.2e} <= {alpha:.1e} (n={len(tokens)})"


def seeded(params: SamplingParams, n: int, first_seed: int) -> list[SamplingParams]:
    """n copies of params with the distinct seeds first_seed, first_seed + 1, ..."""
    return [dataclasses.replace(params, seed=first_seed + i) for i in range(n)]


def draw(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n independent tokens from each row of probs [k, V] -> [n, k] (the test's own draws)."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((n, len(probs))) * cdf[:, -1]
    columns = [np.searchsorted(cdf[k], u[:, k], side="right") for k in range(len(probs))]
    return np.stack(columns, axis=1) if columns else np.zeros((n, 0), dtype=np.int64)


# --- one fixed (p, q) setting, many independent rounds ----------------------------------


@dataclass(frozen=True)
class Case:
    """One fixed (p, q) setting. Drafts are sampled from q, or fixed tokens when ngram."""

    name: str
    params: SamplingParams
    seed: int
    gamma: int = GAMMA
    ngram: bool = False
    variable_num_drafted: bool = False


@dataclass
class Rounds:
    p: np.ndarray  # [gamma + 1, V] processed target distribution per position
    q: np.ndarray  # [gamma, V] processed draft distribution per position (one-hot for ngram)
    num_drafted: torch.Tensor  # [rows]
    out: RejectionOutput


def _setting(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(target logits [gamma + 1, V] float32, p, q, drafted ids [ROUNDS, gamma]); q is a
    perturbed p so that most rounds reach the last position. An n-gram proposal drafts
    one fixed token per position, made likely under the target."""
    target = (1.5 * rng.standard_normal((case.gamma + 1, VOCAB))).astype(np.float32)
    draft = target[: case.gamma] + 0.4 * rng.standard_normal((case.gamma, VOCAB))
    if case.ngram:
        tokens = target[: case.gamma].argmax(-1)
        target[np.arange(case.gamma), tokens] += 2.0
        q, ids = np.eye(VOCAB)[tokens], np.broadcast_to(tokens, (ROUNDS, case.gamma))
    else:
        q = reference_probs(draft, case.params)
        ids = draw(q, ROUNDS, rng)
    return target, reference_probs(target, case.params), q, ids


@functools.lru_cache(maxsize=None)
def _run(case: Case) -> Rounds:
    """ROUNDS independent rounds of the case in one batch (cached: several tests read them)."""
    rng = np.random.default_rng(case.seed)
    target, p, q, ids = _setting(case, rng)
    if case.variable_num_drafted:
        num_drafted = torch.from_numpy(rng.integers(0, case.gamma + 1, ROUNDS))
    else:
        num_drafted = torch.full((ROUNDS,), case.gamma)
    batch = standard_rule(SamplingBatch.from_params(seeded(case.params, ROUNDS, first_seed=case.seed * ROUNDS)))
    draft_probs = None if case.ngram else torch.from_numpy(q).expand(ROUNDS, -1, -1)
    target_logits = torch.from_numpy(target).expand(ROUNDS, -1, -1)
    out = rejection_sample(target_logits, torch.from_numpy(np.ascontiguousarray(ids)), num_drafted, draft_probs, batch)
    return Rounds(p=p, q=q, num_drafted=num_drafted, out=out)


def _assert_emitted_tokens_follow_the_target(
    rounds: Rounds, alpha: float = ALPHA, what: str = "", min_samples: int = 10_000
) -> None:
    tokens, accepted = rounds.out.output_token_ids, rounds.out.num_accepted
    positions = rounds.p.shape[0]
    for k in range(positions):  # 0-based position k = position k + 1 in the docs
        reached = (accepted >= k) & (rounds.num_drafted >= k)  # the round emits a token at k
        emitted = tokens[reached, k]
        assert (emitted >= 0).all()
        assert emitted.numel() >= min_samples, f"{what} position {k + 1}: only {emitted.numel()} samples"
        assert_follows(emitted, rounds.p[k], alpha / positions, f"{what} position {k + 1}")


def _assert_acceptance_rate_is_sum_of_min_p_q(rounds: Rounds) -> None:
    accepted = rounds.out.num_accepted
    for k in range(rounds.q.shape[0]):
        tested = (accepted >= k) & (rounds.num_drafted > k)  # rounds whose draft at k was tested
        n, hits = int(tested.sum()), int((accepted[tested] > k).sum())
        theory = float(np.minimum(rounds.p[k], rounds.q[k]).sum())
        p = stats.binomtest(hits, n, min(theory, 1.0)).pvalue if theory < 1 else float(hits == n)
        assert p > ALPHA / rounds.q.shape[0], f"position {k + 1}: accepted {hits}/{n}, theory {theory:.4f}"


CASES = [
    Case("temperature 1.0", SamplingParams(temperature=1.0), seed=1),
    Case("temperature 0.7", SamplingParams(temperature=0.7), seed=2),
    Case("top-k 4", SamplingParams(temperature=1.0, top_k=4), seed=3),
    Case("top-p 0.8", SamplingParams(temperature=0.9, top_p=0.8), seed=4),
    Case("top-k 6 then top-p 0.9", SamplingParams(temperature=1.2, top_k=6, top_p=0.9), seed=5),
    Case("ngram one-hot q", SamplingParams(temperature=1.0), seed=6, gamma=2, ngram=True),
    Case("ngram one-hot q, top-k 3", SamplingParams(temperature=0.7, top_k=3), seed=7, gamma=2, ngram=True),
    Case("rows with different num_drafted", SamplingParams(temperature=1.0), seed=8, variable_num_drafted=True),
    Case("no proposals (gamma = 0)", SamplingParams(temperature=0.8, top_p=0.9), seed=9, gamma=0),
]


@pytest.fixture(params=CASES, ids=lambda case: case.name)
def rounds(request) -> Rounds:
    return _run(request.param)


def test_emitted_token_at_each_position_follows_the_processed_target_distribution(rounds):
    _assert_emitted_tokens_follow_the_target(rounds)


def test_acceptance_rate_at_each_position_is_the_sum_of_min_p_q(rounds):
    _assert_acceptance_rate_is_sum_of_min_p_q(rounds)


def test_one_seed_at_successive_positions_follows_the_target():
    """A single sequence's rounds share one seed and differ in position: rows at positions
    0, gamma + 1, 2 (gamma + 1), ... never share a uniform, so they are independent rounds."""
    case = Case("one seed", SamplingParams(temperature=1.0, top_k=8, seed=77), seed=10)
    target, p, q, ids = _setting(case, np.random.default_rng(case.seed))
    batch = standard_rule(SamplingBatch.from_params([case.params] * ROUNDS, [r * (GAMMA + 1) for r in range(ROUNDS)]))
    num_drafted = torch.full((ROUNDS,), GAMMA)
    out = rejection_sample(
        torch.from_numpy(target).expand(ROUNDS, -1, -1), torch.from_numpy(ids), num_drafted,
        torch.from_numpy(q).expand(ROUNDS, -1, -1), batch,
    )
    rounds = Rounds(p=p, q=q, num_drafted=num_drafted, out=out)
    _assert_emitted_tokens_follow_the_target(rounds)
    _assert_acceptance_rate_is_sum_of_min_p_q(rounds)


MIXED_KINDS = [  # (setting, num_drafted); the greedy rows' q is a model q they must ignore
    (Case("greedy", SamplingParams(temperature=0.0), seed=21), 2),
    (Case("T 1.0, model q", SamplingParams(temperature=1.0), seed=22), 3),
    (Case("T 0.7 top-k 4, n-gram q", SamplingParams(temperature=0.7, top_k=4), seed=23, ngram=True), 2),
    (Case("T 1.2 top-p 0.8, no drafts", SamplingParams(temperature=1.2, top_p=0.8), seed=24), 0),
    (Case("T 0.9 top-k 6 top-p 0.9, model q", SamplingParams(temperature=0.9, top_k=6, top_p=0.9), seed=25), 1),
    (Case("T 1.0, n-gram q", SamplingParams(temperature=1.0), seed=26, ngram=True), 3),
]


def test_every_row_of_a_mixed_batch_follows_its_own_target():
    """Greedy and sampled rows, model q and one-hot (n-gram) q rows, different parameters
    and num_drafted, interleaved in one call: every kind of row follows its own p at every
    position it reaches, and greedy rows emit exactly the target's argmax."""
    per_kind = 20_000
    rows = len(MIXED_KINDS) * per_kind
    kind_of_row = torch.arange(rows) % len(MIXED_KINDS)
    target_logits = torch.empty(rows, GAMMA + 1, VOCAB, dtype=torch.float32)
    draft_probs = torch.empty(rows, GAMMA, VOCAB, dtype=torch.float64)
    ids, num_drafted = torch.empty(rows, GAMMA, dtype=torch.long), torch.empty(rows, dtype=torch.long)
    params: list[SamplingParams] = [SamplingParams()] * rows
    expected = []
    for j, (kind, n) in enumerate(MIXED_KINDS):
        mine = (kind_of_row == j).nonzero().squeeze(-1)
        target, p, q, kind_ids = _setting(kind, np.random.default_rng(kind.seed))
        target_logits[mine], draft_probs[mine] = torch.from_numpy(target), torch.from_numpy(q)
        ids[mine], num_drafted[mine] = torch.from_numpy(np.ascontiguousarray(kind_ids[:per_kind])), n
        for row, row_params in zip(mine.tolist(), seeded(kind.params, per_kind, first_seed=kind.seed * rows)):
            params[row] = row_params
        expected.append(p)
    batch = standard_rule(SamplingBatch.from_params(params))
    out = rejection_sample(target_logits, ids, num_drafted, draft_probs, batch)
    for j, (kind, n) in enumerate(MIXED_KINDS):
        mine = kind_of_row == j
        tokens, accepted = out.output_token_ids[mine], out.num_accepted[mine]
        if kind.params.is_greedy:
            argmax = torch.from_numpy(expected[j].argmax(-1))  # [GAMMA + 1]
            assert torch.equal(tokens[:, 0], argmax[0].expand(per_kind))
            continue
        rounds = Rounds(expected[j][: n + 1], expected[j][:n], num_drafted[mine], RejectionOutput(tokens, accepted))
        _assert_emitted_tokens_follow_the_target(rounds, ALPHA / (len(MIXED_KINDS) - 1), kind.name, min_samples=2_000)


def test_sample_from_probs_follows_the_distribution():
    probs = np.array([0.0, 0.05, 0.3, 0.0, 0.15, 0.499, 0.001, 0.0, 0.0, 0.0])
    params = seeded(SamplingParams(temperature=1.0), ROUNDS, first_seed=11)
    batch = standard_rule(SamplingBatch.from_params(params, [5] * ROUNDS))
    tokens = sample_from_probs(torch.from_numpy(probs).expand(ROUNDS, -1), batch)
    assert_follows(tokens, probs, ALPHA, "sample_from_probs")


# --- the checks can fail -----------------------------------------------------------------


def test_the_check_tells_the_target_from_the_draft_distribution():
    """The drafted tokens (what a verifier that accepts everything would emit) fail the check."""
    rounds = _run(CASES[0])
    drafted = torch.from_numpy(draw(rounds.q[:1], ROUNDS, np.random.default_rng(0))[:, 0])
    assert p_value(np.bincount(drafted.numpy(), minlength=VOCAB), rounds.p[0]) < ALPHA


def test_the_check_catches_a_verifier_told_the_wrong_q():
    """Drafts sampled from q but verified as if from p: every draft is accepted, and the
    emitted tokens follow q - the check must reject them."""
    case = CASES[0]
    target, p, q, ids = _setting(case, np.random.default_rng(case.seed))
    batch = standard_rule(SamplingBatch.from_params(seeded(case.params, ROUNDS, first_seed=0)))
    out = rejection_sample(
        torch.from_numpy(target).expand(ROUNDS, -1, -1), torch.from_numpy(ids), torch.full((ROUNDS,), GAMMA),
        torch.from_numpy(p[:GAMMA]).expand(ROUNDS, -1, -1), batch,
    )
    assert p_value(np.bincount(out.output_token_ids[:, 0].numpy(), minlength=VOCAB), p[0]) < ALPHA


def test_the_check_catches_a_top_p_that_drops_the_crossing_token():
    """Sampling with a top-p that stops just before the token whose mass reaches top_p."""
    params = SamplingParams(temperature=0.9, top_p=0.8)
    logits = 1.5 * np.random.default_rng(4).standard_normal(VOCAB)
    right, wrong = reference_probs(logits, params), reference_probs(logits, params, top_p_exact=False)
    assert (right > 0).sum() == (wrong > 0).sum() + 1
    u = uniforms(as_seeds(np.arange(ROUNDS, dtype=np.uint64)), np.zeros(ROUNDS, dtype=np.int64), ROLE_FINAL)
    tokens = np.searchsorted(np.cumsum(wrong), u, side="right")
    assert p_value(np.bincount(tokens, minlength=VOCAB), right) < ALPHA
