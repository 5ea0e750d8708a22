"""The coupled rule is exact: a seeded sampled request's emitted tokens follow the processed
target distribution, whatever was drafted.

Setting as in test_rejection_sampler_statistics.py: small vocabularies and fixed,
context-independent p_k (k = 1 .. gamma + 1) and q_k (k = 1 .. gamma) per position; each
batch row is one independent round with a seed of its own, so every row is coupled. The
drafts come from the draft's own sampler (Gumbel-max over q with the shared noise, as the
draft proposer draws them), or are random tokens, or are absent. Conditioned on the round
reaching position k, the emitted token there must follow p_k (chi-squared); a coupled
draft at a reached position k is accepted with the probability that two Gumbel-max
choices under the same noise agree:

    P(agree) = sum_v 1 / sum_w max(p(w) / p(v), q(w) / q(v))    (over v with p(v) q(v) > 0)

(both choose v iff every other token's exponential clock E_w exceeds E_v times that
ratio; integrate over E_v ~ Exp(1)), which is at most sum_v min(p(v), q(v)), the standard
rule's rate. Fixed seeds: every run draws the same numbers; each test holds its checks to
a family-wise ALPHA (Bonferroni).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.sampling.counter_rng import ROLE_DRAFT, as_seeds, token_uniforms
from specdec.sampling.rejection_sampler import RejectionOutput, rejection_sample
from specdec.sampling.sampling import SamplingBatch, sample_from_probs
from specdec.sampling.sampling_params import SamplingParams
from token_statistics import ALPHA, as_table, p_value, reference_probs

pytestmark = pytest.mark.statistical

ROUNDS = 100_000
VOCAB = 10
GAMMA = 3


@dataclass(frozen=True)
class Case:
    """One fixed (p, q) setting; drafts: "coupled" (the draft's Gumbel-max over q with the
    shared noise), "own noise" (drawn from q by the test's own generator: a draft that
    ignores the coupling), "random" (uniform tokens, no q) or "none" (gamma = 0)."""

    name: str
    params: SamplingParams
    seed: int
    drafts: str = "coupled"
    gamma: int = GAMMA


@dataclass
class Rounds:
    p: np.ndarray  # [gamma + 1, V] processed target distribution per position
    q: np.ndarray  # [gamma, V] processed draft distribution per position
    ids: torch.Tensor  # [ROUNDS, gamma] drafted tokens
    num_drafted: torch.Tensor  # [ROUNDS]
    out: RejectionOutput


def _processed(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    return np.array([reference_probs(row, params, check_margins=False) for row in logits])


def _batch(case: Case) -> SamplingBatch:
    params = [dataclasses.replace(case.params, seed=case.seed * ROUNDS + i) for i in range(ROUNDS)]
    batch = SamplingBatch.from_params(params, [3 * (i % 7) for i in range(ROUNDS)])
    assert bool(batch.coupled.all()), "rows with a seed of their own are coupled"
    return batch


@functools.lru_cache(maxsize=None)
def _run(case: Case) -> Rounds:
    """ROUNDS independent rounds of the case in one batch (cached: several tests read them)."""
    rng = np.random.default_rng(case.seed)
    gamma = 0 if case.drafts == "none" else case.gamma
    target = (1.5 * rng.standard_normal((gamma + 1, VOCAB))).astype(np.float32)
    draft = target[:gamma] + 0.6 * rng.standard_normal((gamma, VOCAB))
    p, q = _processed(target, case.params), _processed(draft, case.params)
    batch = _batch(case)
    if case.drafts == "coupled":  # the draft proposer's own sampler, position by position
        columns = [sample_from_probs(torch.from_numpy(q[k]).expand(ROUNDS, -1), batch, k, ROLE_DRAFT)
                   for k in range(gamma)]
        ids = torch.stack(columns, dim=1) if columns else torch.zeros(ROUNDS, 0, dtype=torch.long)
    elif case.drafts == "own noise":
        ids = torch.from_numpy(np.stack([rng.choice(VOCAB, ROUNDS, p=q[k]) for k in range(gamma)], axis=1))
    else:
        ids = torch.from_numpy(rng.integers(0, VOCAB, (ROUNDS, gamma)))
    num_drafted = torch.full((ROUNDS,), gamma)
    draft_probs = None if case.drafts in ("random", "none") else torch.from_numpy(q).expand(ROUNDS, -1, -1)
    out = rejection_sample(torch.from_numpy(target).expand(ROUNDS, -1, -1), ids, num_drafted, draft_probs, batch)
    return Rounds(p=p, q=q, ids=ids, num_drafted=num_drafted, out=out)


def agreement(p: np.ndarray, q: np.ndarray) -> float:
    """P(two Gumbel-max choices from p and q under the same noise agree) (module doc)."""
    both = (p > 0) & (q > 0)
    return float(sum(1.0 / np.maximum(p / p[v], q / q[v]).sum() for v in np.flatnonzero(both)))


def _assert_emitted_tokens_follow_the_target(rounds: Rounds, what: str = "") -> None:
    tokens, accepted = rounds.out.output_token_ids, rounds.out.num_accepted
    positions = rounds.p.shape[0]
    for k in range(positions):
        reached = accepted >= k  # the round emits a token at k
        emitted = tokens[reached, k].numpy()
        assert len(emitted) >= 1_000, f"{what} position {k + 1}: only {len(emitted)} samples"
        p = p_value(emitted, as_table(rounds.p[k]))
        assert p > ALPHA / positions, f"{what} position {k + 1}: chi-squared p-value {p:.2e} (n={len(emitted)})"


CASES = [
    Case("temperature 1.0", SamplingParams(temperature=1.0), seed=1),
    Case("temperature 0.7", SamplingParams(temperature=0.7), seed=2),
    Case("top-k 4", SamplingParams(temperature=1.0, top_k=4), seed=3),
    Case("top-k 6 then top-p 0.9", SamplingParams(temperature=1.2, top_k=6, top_p=0.9), seed=4),
    Case("drafts from q with their own noise", SamplingParams(temperature=0.8), seed=5, drafts="own noise"),
    Case("random drafts", SamplingParams(temperature=0.8), seed=7, drafts="random", gamma=1),
    Case("no drafts (gamma = 0)", SamplingParams(temperature=0.8, top_p=0.9), seed=6, drafts="none"),
]
COUPLED = [case for case in CASES if case.drafts == "coupled"]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_emitted_token_at_each_position_follows_the_processed_target_distribution(case):
    _assert_emitted_tokens_follow_the_target(_run(case), case.name)


@pytest.mark.parametrize("case", COUPLED, ids=lambda case: case.name)
def test_a_coupled_draft_is_accepted_as_often_as_two_gumbel_choices_agree(case):
    rounds = _run(case)
    accepted = rounds.out.num_accepted
    for k in range(GAMMA):
        tested = accepted >= k  # rounds whose draft at k was tested
        n, hits = int(tested.sum()), int((accepted[tested] > k).sum())
        theory = agreement(rounds.p[k], rounds.q[k])
        assert theory <= np.minimum(rounds.p[k], rounds.q[k]).sum() + 1e-12  # never above the standard rule
        p = stats.binomtest(hits, n, theory).pvalue
        assert p > ALPHA / GAMMA, f"position {k + 1}: accepted {hits}/{n}, theory {theory:.4f}"


def test_the_draft_and_the_target_choose_alike_when_p_equals_q():
    """Same distribution, same noise: every drafted token is the target's own choice."""
    case = dataclasses.replace(COUPLED[0], name="q = p")
    batch = _batch(case)
    p = torch.from_numpy(_processed(np.random.default_rng(7).standard_normal((GAMMA + 1, VOCAB)), case.params))
    ids = torch.stack([sample_from_probs(p[k].expand(ROUNDS, -1), batch, k, ROLE_DRAFT) for k in range(GAMMA)], 1)
    out = rejection_sample(p.log().expand(ROUNDS, -1, -1), ids, torch.full((ROUNDS,), GAMMA), None, batch)
    assert bool((out.num_accepted == GAMMA).all())


# --- the checks can fail -----------------------------------------------------------------


def test_the_check_catches_argmax_under_the_wrong_noise():
    """argmax(log p + u) with uniform instead of Gumbel noise is no sample from p."""
    case = COUPLED[0]
    p = _run(case).p[0]
    u = token_uniforms(as_seeds(np.arange(ROUNDS, dtype=np.uint64)), np.zeros(ROUNDS, dtype=np.int64), VOCAB)
    with np.errstate(divide="ignore"):
        tokens = np.argmax(np.log(p)[None, :] + u, axis=-1)
    assert p_value(tokens, as_table(p)) < ALPHA


def test_the_acceptance_check_tells_a_draft_with_its_own_noise():
    """Drafts from q with independent noise (the standard rule's draft) agree less often
    than the shared noise makes them: the binomial check rejects that rate."""
    case = COUPLED[0]
    rounds, batch = _run(case), _batch(case)
    independent = sample_from_probs(torch.from_numpy(rounds.q[0]).expand(ROUNDS, -1),
                                    dataclasses.replace(batch, coupled=torch.zeros_like(batch.coupled)), 0, ROLE_DRAFT)
    hits = int((independent == rounds.out.output_token_ids[:, 0]).sum())
    assert stats.binomtest(hits, ROUNDS, agreement(rounds.p[0], rounds.q[0])).pvalue < ALPHA
