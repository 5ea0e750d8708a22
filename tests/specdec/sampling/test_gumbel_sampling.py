"""Specification of specdec.sampling.gumbel_sampling and the coupled rule: a seeded sampled request's
tokens are a function of the target's distribution and (seed, position) alone.

The decoding scenarios run a tiny context-dependent "model pair" (logits tables indexed by
the previous token) through rejection_sample round by round under different speculation
schedules: no drafts, the draft's coupled guesses, drafts that ignore the coupling, random
drafts, γ changing every round. Every schedule must emit the same tokens. Distributional
exactness is in test_coupled_sampling_statistics.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.sampling.counter_rng import ROLE_DRAFT, ROLE_FINAL, as_seeds
from specdec.sampling.gumbel_sampling import exponential_noise, gumbel_argmax
from specdec.sampling.rejection_sampler import rejection_sample
from specdec.sampling.sampling import SamplingBatch, logits_to_probs, sample_from_probs
from specdec.sampling.sampling_params import SamplingParams

VOCAB = 40
LENGTH = 48


def _probs(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# --- gumbel_argmax -------------------------------------------------------------------------


def test_the_noise_is_positive_and_finite_and_a_function_of_its_address():
    seeds = as_seeds([0, 7, 2**64 - 1])
    noise = exponential_noise(seeds, np.array([[0, 1], [5, 5], [9, 10**12]]), VOCAB)
    assert noise.shape == (3, 2, VOCAB) and noise.dtype == np.float64
    assert (noise > 0).all() and np.isfinite(noise).all()
    assert np.array_equal(noise, exponential_noise(seeds, np.array([[0, 1], [5, 5], [9, 10**12]]), VOCAB))
    assert np.array_equal(noise[1, 0], noise[1, 1])  # same position, same noise
    assert not np.array_equal(noise[0, 0], noise[0, 1])


def test_zero_probability_tokens_are_never_chosen():
    probs = _probs([[0.0, 1e-300, 0.0, 1.0, 0.0]]).expand(20_000, -1)
    tokens = gumbel_argmax(probs, as_seeds(np.arange(20_000, dtype=np.uint64)), torch.zeros(20_000, dtype=torch.long))
    assert set(tokens.tolist()) == {3}
    probs = _probs([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(2_000, -1)
    tokens = gumbel_argmax(probs, as_seeds(np.arange(2_000, dtype=np.uint64)), torch.zeros(2_000, dtype=torch.long))
    assert set(tokens.tolist()) == {1, 3}


def test_the_choice_does_not_depend_on_the_scale_of_the_weights():
    g = torch.Generator().manual_seed(1)
    weights = torch.rand(500, VOCAB, generator=g).double()  # float32 values: exact in both dtypes
    seeds, positions = as_seeds(np.arange(500, dtype=np.uint64)), torch.arange(500)
    first = gumbel_argmax(weights, seeds, positions)
    assert torch.equal(first, gumbel_argmax(weights * 2**-10, seeds, positions))
    assert torch.equal(first, gumbel_argmax(weights.float() * 8, seeds, positions))  # exact in float32 too


def test_a_row_without_positive_finite_mass_is_refused():
    for row in ([0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0]):
        with pytest.raises(ValueError, match="mass"):
            gumbel_argmax(_probs([row]), as_seeds([1]), torch.zeros(1, dtype=torch.long))


def test_positions_of_n_per_row_give_one_token_each():
    probs = torch.softmax(torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(2), dtype=torch.float64), -1)
    seeds, positions = as_seeds([5, 6]), torch.tensor([[0, 1, 2], [7, 8, 9]])
    tokens = gumbel_argmax(probs, seeds, positions)
    assert tokens.shape == (2, 3)
    for b in range(2):
        for j in range(3):
            assert tokens[b, j] == gumbel_argmax(probs[b, j][None], seeds[b : b + 1], positions[b, j][None])[0]


def test_a_coupled_row_draws_the_same_token_in_every_role():
    """The draft's guess and the target's token at a position share their noise."""
    probs = torch.softmax(torch.randn(50, VOCAB, generator=torch.Generator().manual_seed(3), dtype=torch.float64), -1)
    batch = SamplingBatch.from_params([SamplingParams(temperature=1.0, seed=s) for s in range(50)], list(range(50)))
    assert torch.equal(sample_from_probs(probs, batch, 2, ROLE_DRAFT), sample_from_probs(probs, batch, 2, ROLE_FINAL))
    assert torch.equal(sample_from_probs(probs, batch, 2), batch.gumbel_tokens(probs, torch.full((50,), 2)))


def test_only_sampled_rows_with_a_seed_of_their_own_are_coupled():
    params = [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0), SamplingParams(seed=3)]
    batch = SamplingBatch.from_params(params)
    assert batch.coupled.tolist() == [True, False, False]
    assert batch.select(torch.tensor([2, 0])).coupled.tolist() == [False, True]


# --- drafter invariance: every schedule emits the same tokens -------------------------------


class TinyPair:
    """Target and draft logits as tables indexed by the previous token: [V, V] each, the
    draft a noisy copy of the target (so coupled drafts are often accepted)."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.target = 2.0 * torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64)
        self.draft = self.target + 0.7 * torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64)

    def drafts(self, history: list[int], gamma: int, sampling: SamplingParams, how: str, rng: np.random.Generator):
        """(drafted tokens, q [n, V] or None) for the next round; how: coupled, own noise, random."""
        if how == "random":
            return rng.integers(0, VOCAB, gamma).tolist(), None
        batch = SamplingBatch.from_params([sampling], [len(history)])
        if how == "own noise":
            batch = SamplingBatch.from_params([SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)],
                                              [len(history)])
        tokens, qs, last = [], [], history[-1]
        for i in range(gamma):
            q = logits_to_probs(self.draft[last][None], batch)  # [1, V]
            last = int(sample_from_probs(q, batch, i, ROLE_DRAFT)[0])
            tokens.append(last)
            qs.append(q[0])
        return tokens, torch.stack(qs) if qs else None


def decode(pair: TinyPair, sampling: SamplingParams, schedule: list[int], how: str) -> list[int]:
    """LENGTH tokens after the prompt [0], round by round; round r drafts schedule[r % len] tokens."""
    return _decode(pair, sampling, schedule, how)[0]


def _decode(pair: TinyPair, sampling: SamplingParams, schedule: list[int], how: str) -> tuple[list[int], int, int]:
    """decode's tokens, and the drafted and accepted tokens of its rounds."""
    rng, history, rounds, drafted, accepted = np.random.default_rng(0), [0], 0, 0, 0
    while len(history) - 1 < LENGTH:
        gamma = min(schedule[rounds % len(schedule)], LENGTH - len(history))
        ids, q = pair.drafts(history, gamma, sampling, how, rng) if gamma > 0 else ([], None)
        logits = pair.target[[history[-1], *ids]][None]  # [1, gamma + 1, V]
        batch = SamplingBatch.from_params([sampling], [len(history)])
        out = rejection_sample(logits, torch.tensor([ids], dtype=torch.long).reshape(1, len(ids)),
                               torch.tensor([len(ids)]), None if q is None else q[None], batch)
        history += out.emitted()[0]
        rounds, drafted, accepted = rounds + 1, drafted + len(ids), accepted + int(out.num_accepted[0])
    return history[1 : LENGTH + 1], drafted, accepted


SCHEDULES = [
    ("no drafts", [0], "coupled"),
    ("γ 4, coupled drafts", [4], "coupled"),
    ("γ 1, 7, 0, 3, coupled drafts", [1, 7, 0, 3], "coupled"),
    ("γ 4, drafts from q with their own noise", [4], "own noise"),
    ("γ 3, random drafts", [3], "random"),
]


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=1.0, seed=11), SamplingParams(temperature=0.7, top_k=12, top_p=0.9, seed=2**64 - 1)],
    ids=["T 1.0", "T 0.7 top-k top-p"],
)
def test_every_speculation_schedule_emits_the_same_tokens(sampling):
    for pair_seed in range(2):
        pair = TinyPair(pair_seed)
        outputs = {name: decode(pair, sampling, schedule, how) for name, schedule, how in SCHEDULES}
        assert len({tuple(tokens) for tokens in outputs.values()}) == 1, outputs


def test_the_tokens_are_each_positions_gumbel_choice_from_the_target():
    """Plain decoding, spelled out: token t is the Gumbel-max of p(. | token t - 1) at t."""
    pair, sampling = TinyPair(9), SamplingParams(temperature=0.8, seed=5)
    history = [0]
    for t in range(1, LENGTH + 1):
        batch = SamplingBatch.from_params([sampling], [t])
        p = logits_to_probs(pair.target[history[-1]][None], batch)
        history.append(int(gumbel_argmax(p, as_seeds([5]), torch.tensor([t]))[0]))
    assert decode(pair, sampling, [5], "coupled") == history[1:]


def test_coupled_drafts_are_accepted_more_often_than_drafts_that_ignore_the_coupling():
    pair = TinyPair(1)
    rates = {}
    for how in ("coupled", "own noise"):
        counts = [_decode(pair, SamplingParams(temperature=1.0, seed=seed), [4], how)[1:] for seed in range(5)]
        rates[how] = sum(a for _, a in counts) / sum(d for d, _ in counts)
    assert rates["coupled"] > rates["own noise"] > 0
