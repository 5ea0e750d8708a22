"""Rejection sampling is lossless: emitted tokens follow the processed target distribution.

Setting: small vocabularies and fixed, context-independent distributions per position -
the target's p_k at positions k = 1 .. gamma + 1 and the draft's q_k at k = 1 .. gamma,
different at every position and already processed with the row's SamplingParams. Each
batch row is one independent round. Conditioned on the round reaching position k, the
token emitted there (accepted, recovered or bonus) must be distributed as p_k; and the
drafted token at a reached position k is accepted with probability sum(min(p_k, q_k)).

Checks are chi-squared goodness-of-fit tests (p-value > 0.001) over >= 100k rounds, with
fixed seeds so that every run draws the same numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
from scipy import stats

from specdec.rejection_sampler import RejectionOutput, rejection_sample
from specdec.sampling import SamplingBatch, logits_to_probs, sample_from_probs
from specdec.sampling_params import SamplingParams

pytestmark = pytest.mark.statistical

ROUNDS = 100_000
VOCAB = 10
GAMMA = 3
MIN_P_VALUE = 1e-3
MIN_EXPECTED = 5.0


def chi_square_p_value(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of token counts [V] to probabilities [V].

    Tokens of zero probability must never be observed (asserted). Cells expected fewer
    than MIN_EXPECTED times are pooled into one cell, itself folded into the largest cell
    when it is still too small.
    """
    observed, probs = observed.double(), probs.double()
    impossible = probs == 0
    emitted_impossible = (impossible & (observed > 0)).nonzero().flatten().tolist()
    assert not emitted_impossible, f"emitted tokens of zero probability: {emitted_impossible}"
    expected = probs / probs.sum() * observed.sum()
    small = ~impossible & (expected < MIN_EXPECTED)
    keep = ~impossible & ~small
    obs_cells, exp_cells = observed[keep].clone(), expected[keep].clone()
    if small.any():
        pooled_obs, pooled_exp = observed[small].sum(), expected[small].sum()
        if pooled_exp >= MIN_EXPECTED:
            obs_cells = torch.cat([obs_cells, pooled_obs[None]])
            exp_cells = torch.cat([exp_cells, pooled_exp[None]])
        else:
            largest = exp_cells.argmax()
            obs_cells[largest] += pooled_obs
            exp_cells[largest] += pooled_exp
    if obs_cells.numel() < 2:
        return 1.0  # a single possible outcome: nothing to test beyond the zero cells
    return float(stats.chisquare(obs_cells.numpy(), exp_cells.numpy()).pvalue)


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
    p: torch.Tensor  # [gamma + 1, V] processed target distribution per position
    q: torch.Tensor  # [gamma, V] processed draft distribution per position (one-hot for ngram)
    num_drafted: torch.Tensor  # [ROUNDS]
    out: RejectionOutput


def _distributions(case: Case, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target logits [gamma + 1, V] and draft logits [gamma, V]: q a perturbed p, so that
    most rounds reach the last position."""
    target = 1.5 * torch.randn(case.gamma + 1, VOCAB, generator=g)
    draft = target[: case.gamma] + 0.4 * torch.randn(case.gamma, VOCAB, generator=g)
    return target, draft


def _ngram_proposal(target: torch.Tensor, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An n-gram proposal is deterministic: one fixed token per position, made likely under
    the target (edits target in place). Returns (token ids [ROUNDS, gamma], one-hot q [gamma, V])."""
    tokens = target[:gamma].argmax(-1)  # [gamma]
    target[torch.arange(gamma), tokens] += 2.0
    return tokens.expand(ROUNDS, -1), torch.nn.functional.one_hot(tokens, VOCAB).float()


def _sample_drafts(q: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """ROUNDS independent drafts: token ids [ROUNDS, gamma], position k drawn from q[k]."""
    if q.shape[0] == 0:
        return torch.zeros(ROUNDS, 0, dtype=torch.long)
    return torch.multinomial(q, ROUNDS, replacement=True, generator=g).T


@functools.lru_cache(maxsize=None)
def _run(case: Case) -> Rounds:
    """ROUNDS independent rounds of the case in one batch (cached: several tests read them)."""
    g = torch.Generator().manual_seed(case.seed)
    target, draft = _distributions(case, g)
    one = SamplingBatch.from_params([case.params])
    if case.ngram:
        ids, q = _ngram_proposal(target, case.gamma)
        draft_probs = None
    else:
        q = logits_to_probs(draft[None], one)[0]  # [gamma, V]
        ids = _sample_drafts(q, g)  # [ROUNDS, gamma]
        draft_probs = q.expand(ROUNDS, -1, -1)  # [ROUNDS, gamma, V]
    p = logits_to_probs(target[None], one)[0]  # [gamma + 1, V]
    if case.variable_num_drafted:
        num_drafted = torch.randint(0, case.gamma + 1, (ROUNDS,), generator=g)
    else:
        num_drafted = torch.full((ROUNDS,), case.gamma)
    batch = SamplingBatch.from_params([case.params] * ROUNDS)
    with torch.random.fork_rng():
        torch.manual_seed(case.seed)
        out = rejection_sample(target.expand(ROUNDS, -1, -1), ids, num_drafted, draft_probs, batch)
    return Rounds(p=p, q=q, num_drafted=num_drafted, out=out)


def _assert_emitted_tokens_follow_the_target(rounds: Rounds) -> None:
    tokens, accepted = rounds.out.output_token_ids, rounds.out.num_accepted
    for k in range(rounds.p.shape[0]):  # 0-based position k = position k + 1 in the docs
        reached = (accepted >= k) & (rounds.num_drafted >= k)  # the round emits a token at k
        emitted = tokens[reached, k]
        assert (emitted >= 0).all()
        assert emitted.numel() >= 10_000, f"position {k + 1}: only {emitted.numel()} samples"
        counts = torch.bincount(emitted, minlength=VOCAB)
        p_value = chi_square_p_value(counts, rounds.p[k])
        assert p_value > MIN_P_VALUE, f"position {k + 1}: chi-squared p-value {p_value:.2e}"


def _assert_acceptance_rate_is_sum_of_min_p_q(rounds: Rounds) -> None:
    accepted = rounds.out.num_accepted
    for k in range(rounds.q.shape[0]):
        tested = (accepted >= k) & (rounds.num_drafted > k)  # rounds whose draft at k was tested
        n = int(tested.sum())
        measured = float((accepted[tested] > k).double().mean())
        theory = float(torch.minimum(rounds.p[k], rounds.q[k]).sum())
        tolerance = 5 * (theory * (1 - theory) / n) ** 0.5 + 1e-6
        assert abs(measured - theory) < tolerance, (
            f"position {k + 1}: acceptance rate {measured:.4f}, theory {theory:.4f} (n={n})"
        )


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


def test_seeded_rows_follow_the_processed_target_distribution():
    # Every row with its own generator: the per-row draw path, not the batched one.
    case = Case("seeded", SamplingParams(temperature=1.0), seed=10)
    g = torch.Generator().manual_seed(case.seed)
    target, draft = _distributions(case, g)
    one = SamplingBatch.from_params([case.params])
    p, q = logits_to_probs(target[None], one)[0], logits_to_probs(draft[None], one)[0]
    ids = _sample_drafts(q, g)  # [ROUNDS, gamma]
    batch = SamplingBatch.from_params([SamplingParams(temperature=1.0, seed=s) for s in range(ROUNDS)])
    num_drafted = torch.full((ROUNDS,), GAMMA)
    out = rejection_sample(target.expand(ROUNDS, -1, -1), ids, num_drafted, q.expand(ROUNDS, -1, -1), batch)
    rounds = Rounds(p=p, q=q, num_drafted=num_drafted, out=out)
    _assert_emitted_tokens_follow_the_target(rounds)
    _assert_acceptance_rate_is_sum_of_min_p_q(rounds)


def test_the_check_tells_the_target_from_the_draft_distribution():
    # Power check: the tokens emitted at position 1 do not pass as draws from q_1.
    rounds = _run(CASES[0])
    counts = torch.bincount(rounds.out.output_token_ids[:, 0], minlength=VOCAB)
    assert chi_square_p_value(counts, rounds.q[0]) < MIN_P_VALUE


def test_sample_from_probs_follows_the_distribution():
    probs = torch.tensor([0.0, 0.05, 0.3, 0.0, 0.15, 0.499, 0.001, 0.0, 0.0, 0.0])
    with torch.random.fork_rng():
        torch.manual_seed(11)
        tokens = sample_from_probs(probs.expand(ROUNDS, -1), [None] * ROUNDS)
    assert chi_square_p_value(torch.bincount(tokens, minlength=probs.numel()), probs) > MIN_P_VALUE
