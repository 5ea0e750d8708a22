"""Sampling follows the processed distribution to float64 resolution, at any temperature.

The checks here are exact, not statistical: uniforms are the values k * 2**-53
(specdec.sampling.counter_rng), and inverse_cdf_sample is monotone in u, so the probability of
each token is (number of k that select it) / 2**53. `exact_measure` finds, by a
vectorised binary search over k, the first k of every token's interval, which gives that
probability for every token of a large vocabulary at once.

Guarantees:
* on a 32k-150k vocabulary with a long-tailed distribution, the sampler's distribution is
  within 1e-9 total variation of the float64 normalised probabilities, and every token of
  positive probability can be drawn (zero-probability tokens never);
* the same through logits_to_probs, against a softmax computed independently (numpy,
  log-sum-exp, float64);
* any finite temperature > 0 works: T -> 0 gives the argmax (ties split evenly), T -> inf
  the uniform distribution over the tokens with finite logits, with or without top-k /
  top-p, and no overflow ever sends the mass to the last vocabulary id;
* SamplingParams refuses temperatures and top_p values that are not finite numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.sampling.sampling import SamplingBatch, inverse_cdf_sample, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams

GRID = 2**53  # uniforms are k / GRID, k = 0 .. GRID - 1
MAX_TV = 1e-9


def exact_measure(probs: torch.Tensor, sampler=inverse_cdf_sample) -> torch.Tensor:
    """probs: [V] weights -> [V] float64: the exact probability that the sampler
    (inverse_cdf_sample) returns each token when u is uniform on the grid k * 2**-53.

    Token i is returned for the k in [start_i, start_i+1), start_i being the smallest k with
    token(k) >= i (the sampler is monotone in u). All V - 1 boundaries are searched at once
    with u of shape [1, V - 1]; 54 halvings pin every one of them down.
    """
    vocab = probs.numel()
    token_ids = torch.arange(1, vocab)  # [V - 1]: the boundary searched in each column
    lo = torch.zeros(vocab - 1, dtype=torch.int64)
    hi = torch.full((vocab - 1,), GRID, dtype=torch.int64)  # GRID = "no k selects token >= i"
    while bool((searching := lo < hi).any()):
        mid = torch.where(searching, (lo + hi) // 2, 0)  # converged columns ask u = 0
        tokens = sampler(probs[None], (mid.double() / GRID)[None])[0]  # [V - 1]
        reached = tokens >= token_ids
        hi = torch.where(searching & reached, mid, hi)
        lo = torch.where(searching & ~reached, mid + 1, lo)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), lo, torch.tensor([GRID])])
    counts = starts.diff()  # [V] number of grid points selecting each token
    assert (counts >= 0).all(), "inverse_cdf_sample is not monotone in u"
    _spot_check(probs, starts, sampler)
    return counts.double() / GRID


def _spot_check(probs: torch.Tensor, starts: torch.Tensor, sampler, n: int = 20_000) -> None:
    """The interval table predicts the sampler's token at random grid points."""
    k = torch.randint(0, GRID, (n,), generator=torch.Generator().manual_seed(0))
    predicted = torch.searchsorted(starts, k, right=True) - 1
    assert torch.equal(sampler(probs[None], (k.double() / GRID)[None])[0], predicted)


def total_variation(a: torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    return 0.5 * float((a - torch.as_tensor(b, dtype=torch.float64)).abs().sum())


def zipf(vocab: int, exponent: float, seed: int, zero_every: int = 0) -> torch.Tensor:
    """Unnormalised Zipf weights 1 / rank**exponent in a fixed random token order (long
    tail spread over the whole vocabulary), optionally with every n-th token at zero."""
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** exponent
    weights = weights[torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))]
    if zero_every:
        weights[::zero_every] = 0.0
    return weights


def numpy_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Reference softmax in float64 with log-sum-exp (independent of specdec)."""
    x = logits.astype(np.float64) / temperature
    finite = np.isfinite(x)
    m = x[finite].max()
    lse = m + np.log(np.exp(x[finite] - m).sum())
    return np.where(finite, np.exp(np.where(finite, x, m) - lse), 0.0)


def _batch(**params) -> SamplingBatch:
    return SamplingBatch.from_params([SamplingParams(**params)])


# --- (a) inverse_cdf_sample on large vocabularies ----------------------------------------


@pytest.mark.parametrize(
    "vocab, exponent, zero_every",
    [
        (32_768, 1.0, 97),  # ~3e-6 at the tail, some impossible tokens
        (151_936, 1.1, 0),  # a 150k vocabulary
        (32_768, 3.0, 0),  # tail probabilities down to 2.5e-14, next to mass ~1 in the cdf
    ],
)
def test_inverse_cdf_sample_follows_long_tailed_distributions_to_1e_minus_9(vocab, exponent, zero_every):
    weights = zipf(vocab, exponent, seed=vocab + int(exponent), zero_every=zero_every)  # unnormalised
    probs = weights / weights.sum()
    measure = exact_measure(weights)
    assert total_variation(measure, probs) <= MAX_TV
    assert (measure[probs > 0] > 0).all(), "a token of positive probability can never be drawn"
    assert (measure[probs == 0] == 0).all()


def test_inverse_cdf_sample_resolves_a_single_1e_minus_15_token_after_the_bulk_of_the_mass():
    weights = torch.tensor([0.25, 0.5, 0.25 - 1e-15, 1e-15, 0.0], dtype=torch.float64)
    measure = exact_measure(weights)
    assert measure[3] > 0 and abs(float(measure[3]) - 1e-15) < 2**-52
    assert measure[4] == 0


def test_the_bound_tells_a_float32_sampler_apart():
    """The check has teeth: the same inverse CDF in float32 misses the bound by far."""

    def float32_sampler(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        cdf = probs.float().cumsum(-1)
        target = u.float() * cdf[:, -1:]
        return torch.searchsorted(cdf, target, right=True).clamp(max=probs.shape[-1] - 1)

    weights = zipf(151_936, 1.1, seed=0)
    assert total_variation(exact_measure(weights, float32_sampler), weights / weights.sum()) > 1e-4


# --- (b) through logits_to_probs ---------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_logits_to_probs_then_sampling_matches_an_independent_float64_softmax(temperature):
    g = torch.Generator().manual_seed(1)
    zipf_logits = zipf(50_257, 1.05, seed=2).log()  # a long tail of low logits
    logits = (zipf_logits + 0.5 * torch.randn(50_257, generator=g, dtype=torch.float64)).float()
    logits[torch.randperm(50_257, generator=g)[:100]] = float("-inf")  # masked tokens
    probs = logits_to_probs(logits[None], _batch(temperature=temperature))[0]
    assert probs.dtype == torch.float64
    reference = numpy_softmax(logits.numpy(), temperature)
    measure = exact_measure(probs)
    assert total_variation(measure, reference) <= MAX_TV
    assert (measure[torch.from_numpy(reference) > 2**-50] > 0).all()
    assert (measure[torch.isinf(logits)] == 0).all()


# --- (c) extreme temperatures ------------------------------------------------------------

TINY = [1e-38, 1e-45, 1e-300]
F32_MAX = float(torch.finfo(torch.float32).max)


def _extreme_logits(vocab: int = 4096) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """float32 logits with a two-way tie at the maximum (3e38, near float32's limit), the
    last id a single float32 step below it, huge negative and -inf entries. Returns
    (logits [V], the argmax ids, the mask of finite logits)."""
    logits = 3 * torch.randn(vocab, generator=torch.Generator().manual_seed(3))
    top = torch.tensor(3e38, dtype=torch.float32)
    logits[[17, 3000]] = top
    logits[-1] = torch.nextafter(top, torch.tensor(0.0))  # near-tie: wins any overflow
    logits[[5, 900]] = -F32_MAX
    logits[[6, 901, 2000]] = float("-inf")
    return logits, [17, 3000], torch.isfinite(logits)


@pytest.mark.parametrize("temperature", TINY)
@pytest.mark.parametrize("filters", [{}, {"top_k": 5}, {"top_p": 0.3}, {"top_k": 50, "top_p": 0.9}])
def test_a_tiny_temperature_is_the_argmax_with_ties_split_evenly(temperature, filters):
    logits, argmax, _ = _extreme_logits()
    probs = logits_to_probs(logits[None], _batch(temperature=temperature, **filters))[0]
    expected = torch.zeros_like(probs)
    expected[argmax] = 0.5
    assert torch.equal(probs, expected)
    measure = exact_measure(probs)
    assert torch.equal(measure, expected)
    assert measure[-1] == 0, "the last vocabulary id must not win by overflow"


@pytest.mark.parametrize("temperature", TINY)
def test_a_tiny_temperature_splits_evenly_over_half_precision_ties(temperature):
    logits = (2 * torch.randn(32_768, generator=torch.Generator().manual_seed(4))).bfloat16()
    top = logits.max()
    logits[[10, 20_000, 32_000]] = top + 1  # bfloat16 logits tie often
    probs = logits_to_probs(logits[None], _batch(temperature=temperature))[0]
    measure = exact_measure(probs)
    assert (measure[[10, 20_000, 32_000]] - 1 / 3).abs().max() < 1e-15
    assert float(measure.sum()) == 1.0 and int((measure > 0).sum()) == 3


@pytest.mark.parametrize("temperature", [1e300, 1e200])
def test_a_huge_temperature_is_uniform_over_the_finite_logits(temperature):
    logits, _, finite = _extreme_logits()  # includes -3.4e38 and 3e38: still uniform
    probs = logits_to_probs(logits[None], _batch(temperature=temperature))[0]
    expected = finite.double() / int(finite.sum())
    measure = exact_measure(probs)
    assert total_variation(measure, expected) <= MAX_TV
    assert (measure[~finite] == 0).all()


@pytest.mark.parametrize("temperature", [1e300, 1e100])
@pytest.mark.parametrize(
    "filters, kept",
    [({"top_k": 10}, 10), ({"top_p": 0.5}, 2048), ({"top_k": 10, "top_p": 0.5}, 5), ({"top_k": 10, "top_p": 0.51}, 6)],
)
def test_filters_at_a_huge_temperature_keep_the_largest_logits_equally_likely(temperature, filters, kept):
    """The probabilities are all equal in float64, but the filters still follow the logits:
    top-k keeps the k largest, top-p the smallest prefix by logit whose (equal) mass reaches
    top_p (2048 of 4095 tokens for 0.5; 5 of the top 10 for 0.5, 6 for 0.51)."""
    logits = 3 * torch.randn(4096, generator=torch.Generator().manual_seed(5))
    logits[7] = float("-inf")
    largest = logits.topk(kept).indices
    probs = logits_to_probs(logits[None], _batch(temperature=temperature, **filters))[0]
    expected = torch.zeros(4096, dtype=torch.float64)
    expected[largest] = 1 / kept
    assert total_variation(exact_measure(probs), expected) <= MAX_TV


def test_temperature_scaling_never_produces_nan():
    logits = torch.tensor([[F32_MAX, -F32_MAX, 0.0, float("-inf")]] * 2)
    for t in TINY + [1.0, 1e38, 1e300]:
        probs = logits_to_probs(logits, SamplingBatch.from_params([SamplingParams(temperature=t, top_p=0.9)] * 2))
        assert torch.isfinite(probs).all() and (probs.sum(-1) == 1).all()


# --- (d) parameter validation ------------------------------------------------------------


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), float("-inf"), -1e-300, -1.0])
def test_temperatures_that_are_not_finite_and_non_negative_are_rejected(temperature):
    with pytest.raises(ValueError):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("top_p", [float("nan"), float("inf"), float("-inf"), 0.0, -0.5, 1.0 + 1e-12])
def test_top_p_outside_zero_one_is_rejected(top_p):
    with pytest.raises(ValueError):
        SamplingParams(temperature=1.0, top_p=top_p)


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-45, 1e300, 1.7e308])
def test_every_finite_positive_temperature_is_accepted(temperature):
    assert not SamplingParams(temperature=temperature).is_greedy
