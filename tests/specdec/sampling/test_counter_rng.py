"""Specification of specdec.sampling.counter_rng: uniforms addressed by (seed, position, role).

Every uniform is a pure function of its address, lies in [0, 1) on the grid k * 2**-53
(so float64 carries it exactly), and the numbers look independent whichever way the
address is varied: along the positions of one stream, across the roles at one position,
and across neighbouring seeds. The statistical checks use ~10**6 values and fixed
addresses, so they are deterministic; each asserts a p-value above ALPHA / (number of
checks in the test) (Bonferroni).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specdec.sampling.counter_rng import (MAX_SEED, ROLE_ACCEPT, ROLE_DRAFT, ROLE_FINAL, as_seeds, token_uniforms,
                                          uniforms)

ROLES = (ROLE_DRAFT, ROLE_ACCEPT, ROLE_FINAL)
N = 1_000_000
ALPHA = 1e-4
GRID = 2.0**53


def _stream(seed: int, n: int = N, role: int = ROLE_FINAL, start: int = 0) -> np.ndarray:
    """The uniforms of one seed at positions start .. start + n - 1."""
    return uniforms(as_seeds([seed]), np.arange(start, start + n)[None, :], role)[0]


def _across_seeds(first_seed: int, position: int = 7, n: int = N, role: int = ROLE_FINAL) -> np.ndarray:
    """The uniforms of seeds first_seed .. first_seed + n - 1 at one position."""
    return uniforms(as_seeds(np.arange(first_seed, first_seed + n, dtype=np.uint64)), np.full(n, position), role)


def _pair_p_values(x: np.ndarray, y: np.ndarray, bins: int = 32) -> tuple[float, float]:
    """(Pearson correlation p-value, 2-D chi-squared p-value on a bins x bins grid) of pairs (x, y)."""
    correlation = stats.pearsonr(x, y).pvalue
    cells = (np.floor(x * bins) * bins + np.floor(y * bins)).astype(np.int64)
    counts = np.bincount(cells, minlength=bins * bins)
    return float(correlation), float(stats.chisquare(counts).pvalue)


# --- values, determinism, shapes ---------------------------------------------------------


def test_uniforms_are_float64_in_the_unit_interval_on_the_2_to_the_minus_53_grid():
    u = _stream(seed=3, n=100_000)
    assert u.dtype == np.float64
    assert (u >= 0).all() and (u < 1).all()
    k = u * GRID
    assert np.array_equal(k, np.floor(k)), "every uniform is k * 2**-53 for an integer k"
    assert len(np.unique(u)) == len(u)  # 10**5 draws from 2**53 values: no repeats


def test_the_same_address_always_gives_the_same_uniform():
    seeds, positions = as_seeds([5, 2**63 + 1, 0]), np.array([[0, 9], [4, 4], [123_456_789, 2]])
    for role in ROLES:
        assert np.array_equal(uniforms(seeds, positions, role), uniforms(seeds, positions, role))


def test_known_values_are_pinned():
    """The hash is part of the contract: a seeded request replays the same tokens on any
    worker and any version. Changing it changes every seeded output, so it must be deliberate."""
    u = uniforms(as_seeds([0]), [[0, 1, 2]], ROLE_FINAL)[0]
    assert u.tolist() == [0.31866067169550083, 0.3346297367994273, 0.8279956303688174]
    u = uniforms(as_seeds([12345]), [[0, 1, 2]], ROLE_DRAFT)[0]
    assert u.tolist() == [0.004554420676634585, 0.08533287331246864, 0.5437415038668252]


def test_output_has_the_shape_of_positions_and_row_b_uses_seeds_b():
    seeds = as_seeds([11, 22, 33])
    positions = np.array([[0, 1, 5, 5], [7, 3, 2, 0], [9, 9, 9, 100]])
    u = uniforms(seeds, positions, ROLE_ACCEPT)
    assert u.shape == (3, 4)
    for b in range(3):
        for j in range(4):
            alone = uniforms(seeds[b : b + 1], positions[b : b + 1, j], ROLE_ACCEPT)
            assert alone.shape == (1,) and alone[0] == u[b, j]
    assert u[0, 2] == u[0, 3] and u[2, 0] == u[2, 1]  # same address, same number
    flat = uniforms(seeds, positions[:, 0], ROLE_ACCEPT)
    assert flat.shape == (3,) and np.array_equal(flat, u[:, 0])
    assert uniforms(seeds, np.zeros((3, 0), dtype=np.int64), ROLE_ACCEPT).shape == (3, 0)


def test_seed_position_and_role_each_change_the_uniform():
    base = uniforms(as_seeds([1]), [10], ROLE_DRAFT)[0]
    assert uniforms(as_seeds([2]), [10], ROLE_DRAFT)[0] != base
    assert uniforms(as_seeds([1 + 2**63]), [10], ROLE_DRAFT)[0] != base  # the top seed bit counts
    assert uniforms(as_seeds([1]), [11], ROLE_DRAFT)[0] != base
    assert uniforms(as_seeds([1]), [10], ROLE_ACCEPT)[0] != base


def test_positions_must_be_non_negative_and_one_row_per_seed():
    with pytest.raises(AssertionError):
        uniforms(as_seeds([1]), [-1], ROLE_FINAL)
    with pytest.raises(AssertionError):
        uniforms(as_seeds([1, 2]), [[0, 1]], ROLE_FINAL)


# --- seeds -------------------------------------------------------------------------------


def test_seeds_are_every_uint64_exactly():
    seeds = as_seeds([0, 1, 2**53 + 1, MAX_SEED])
    assert seeds.dtype == np.uint64
    assert [int(s) for s in seeds] == [0, 1, 2**53 + 1, 2**64 - 1]  # no float rounding on the way
    assert as_seeds(7).shape == (1,)
    assert np.array_equal(as_seeds(np.array([3, 4], dtype=np.uint64)), [3, 4])


@pytest.mark.parametrize("bad", [-1, 2**64, [0, -5], [2**70], np.array([-2], dtype=np.int64)])
def test_seeds_outside_uint64_are_rejected(bad):
    with pytest.raises(ValueError):
        as_seeds(bad)


def test_non_integer_seeds_are_rejected():
    with pytest.raises(ValueError):
        as_seeds([1.5])


def test_uniforms_need_uint64_seeds():
    with pytest.raises(AssertionError):
        uniforms(np.array([1, 2], dtype=np.int64), [0, 0], ROLE_FINAL)


# --- statistical quality (10**6 values each) ---------------------------------------------


@pytest.mark.statistical
def test_values_along_a_stream_and_across_seeds_are_uniform():
    """Kolmogorov-Smirnov against U(0, 1) and a 1024-bin histogram, for one seed's positions
    (in every role), for a million consecutive seeds at one position, and for seeds near 2**64."""
    samples = [_stream(seed=2024, role=role) for role in ROLES]
    samples += [_across_seeds(0), _across_seeds(MAX_SEED - N + 1)]
    checks = 2 * len(samples)
    for u in samples:
        assert stats.kstest(u, "uniform").pvalue > ALPHA / checks
        counts = np.bincount((u * 1024).astype(np.int64), minlength=1024)
        assert stats.chisquare(counts).pvalue > ALPHA / checks


@pytest.mark.statistical
def test_adjacent_positions_are_independent():
    """Pairs (u_t, u_t+1) of one stream: no correlation, uniform on the unit square."""
    u = _stream(seed=99, n=N + 1)
    correlation, square = _pair_p_values(u[:-1], u[1:])
    assert correlation > ALPHA / 4 and square > ALPHA / 4
    lag_two = _pair_p_values(u[:-2], u[2:])
    assert min(lag_two) > ALPHA / 4


@pytest.mark.statistical
def test_roles_at_the_same_position_are_independent():
    """The draft's sample, the acceptance test and the final token at one position must
    not be related (a shared number would bias which drafts are accepted)."""
    seeds = as_seeds(np.arange(N, dtype=np.uint64))
    positions = np.full(N, 3)
    by_role = {role: uniforms(seeds, positions, role) for role in ROLES}
    pairs = [(ROLE_DRAFT, ROLE_ACCEPT), (ROLE_DRAFT, ROLE_FINAL), (ROLE_ACCEPT, ROLE_FINAL)]
    for a, b in pairs:
        assert min(_pair_p_values(by_role[a], by_role[b])) > ALPHA / (2 * len(pairs))


@pytest.mark.statistical
def test_adjacent_seeds_are_independent():
    """Requests often get consecutive seeds (0, 1, 2, ...): their streams must not be related,
    at the same position nor shifted by one."""
    u = _across_seeds(1000, position=0, n=N + 1)
    same_position = _pair_p_values(u[:-1], u[1:])
    shifted = _pair_p_values(_across_seeds(1000, position=1, n=N), u[1:])  # (s, t + 1) vs (s + 1, t)
    assert min(same_position + shifted) > ALPHA / 4


# --- per-token uniforms (the Gumbel noise of seeded sampled requests) ----------------------


def test_token_uniforms_have_one_value_per_token_on_the_grid_and_are_pinned():
    u = token_uniforms(as_seeds([0, 9]), np.array([[0, 1], [4, 4]]), 5)
    assert u.shape == (2, 2, 5) and u.dtype == np.float64
    assert (u >= 0).all() and (u < 1).all() and np.array_equal(u * GRID, np.floor(u * GRID))
    assert np.array_equal(u[1, 0], u[1, 1])  # same address, same numbers
    pinned = [0.005253605762664981, 0.9132612763363585, 0.7005676057384473]  # see test_known_values_are_pinned
    assert token_uniforms(as_seeds([0]), [0], 3)[0].tolist() == pinned
    assert np.array_equal(token_uniforms(as_seeds([9]), [4], 5)[0], u[1, 0])  # a pure function of the address


def test_token_uniforms_differ_from_every_other_roles_uniforms():
    seeds, positions = as_seeds(np.arange(1000, dtype=np.uint64)), np.full(1000, 6)
    per_token = token_uniforms(seeds, positions, 4)  # [1000, 4]
    for role in ROLES:
        assert not np.isin(uniforms(seeds, positions, role), per_token).any()


@pytest.mark.statistical
def test_token_uniforms_are_uniform_and_independent_across_tokens_positions_and_seeds():
    """The noise of neighbouring tokens, of one token at neighbouring positions, and of
    neighbouring seeds: each marginal uniform, each pair unrelated."""
    u = token_uniforms(as_seeds(np.arange(N // 64, dtype=np.uint64)), np.zeros(N // 64, dtype=np.int64), 64)
    stream = token_uniforms(as_seeds([5]), np.arange(N)[None, :], 2)[0]  # [N, 2]: positions x 2 tokens
    pairs = [(u[:, :-1].ravel(), u[:, 1:].ravel()), (stream[:-1, 0], stream[1:, 0]), (u[:-1, 0], u[1:, 0]),
             (stream[:, 0], stream[:, 1])]
    checks = 3 * len(pairs)
    for x, y in pairs:
        assert stats.kstest(x, "uniform").pvalue > ALPHA / checks
        assert min(_pair_p_values(x, y)) > ALPHA / checks
