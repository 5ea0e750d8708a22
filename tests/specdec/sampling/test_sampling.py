"""Specification of specdec.sampling.sampling: turning logits into processed probabilities and
drawing tokens with addressed (counter-based) uniforms.

Randomness guarantees: a sampled row's token is a function of its probabilities and of
the uniform addressed by (its seed, batch.positions[b] + offset, role) alone - not of its
batch neighbours, its place in the batch, or how many draws came before. Greedy rows use
no randomness at all. Probabilities and uniforms are float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specdec.sampling.counter_rng import ROLE_ACCEPT, ROLE_DRAFT, ROLE_FINAL, as_seeds, uniforms
from specdec.sampling.sampling import (
    SamplingBatch,
    inverse_cdf_sample,
    logits_to_probs,
    normalize_probs,
    row_index,
    sample_from_probs,
)
from specdec.sampling.sampling_params import SamplingParams
from sampling_rules import standard_rule

F64 = torch.float64


def _batch(*params: SamplingParams, positions: list[int] | None = None) -> SamplingBatch:
    return SamplingBatch.from_params(list(params), positions)


def _logits_of(probs: list[float]) -> torch.Tensor:
    """[1, V] logits whose softmax at temperature 1 is `probs`."""
    return torch.tensor([probs], dtype=F64).log()


def _probs(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# --- SamplingBatch -----------------------------------------------------------------------


def test_from_params_builds_one_float64_entry_per_row():
    batch = _batch(
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3),
        positions=[4, 9],
    )
    assert batch.batch_size == 2
    assert batch.temperature.dtype == F64 and batch.temperature.tolist() == [0.0, 0.7]
    assert batch.top_k.dtype == torch.int64 and batch.top_k.tolist() == [0, 5]
    assert batch.top_p.dtype == F64 and batch.top_p.tolist() == [1.0, 0.9]
    assert batch.greedy.tolist() == [True, False]
    assert batch.positions.dtype == torch.int64 and batch.positions.tolist() == [4, 9]
    assert batch.seeds.dtype == np.uint64 and int(batch.seeds[1]) == 3


def test_temperature_is_kept_in_float64_however_small():
    batch = _batch(SamplingParams(temperature=1e-45), SamplingParams(temperature=1e-300))
    assert batch.temperature.tolist() == [1e-45, 1e-300]  # float32 would make these 0 or denormal
    assert not batch.greedy.any()


def test_positions_default_to_zero():
    assert _batch(SamplingParams(), SamplingParams(temperature=1.0)).positions.tolist() == [0, 0]


def test_seeded_rows_keep_their_seed_exactly():
    batch = _batch(SamplingParams(temperature=1.0, seed=2**64 - 1), SamplingParams(temperature=1.0, seed=0))
    assert [int(s) for s in batch.seeds] == [2**64 - 1, 0]


def test_unseeded_rows_get_a_fresh_random_seed_per_call():
    params = [SamplingParams(temperature=1.0)] * 2
    first, second = _batch(*params), _batch(*params)
    assert first.seeds[0] != first.seeds[1]
    assert not np.array_equal(first.seeds, second.seeds)


def test_from_params_needs_one_position_per_row():
    with pytest.raises(AssertionError):
        _batch(SamplingParams(), positions=[0, 1])


def test_all_greedy_is_true_only_when_every_row_has_temperature_zero():
    assert _batch(SamplingParams(), SamplingParams()).all_greedy
    assert not _batch(SamplingParams(), SamplingParams(temperature=0.5)).all_greedy


def _raw_batch(**overrides) -> SamplingBatch:
    fields = dict(
        temperature=torch.tensor([1.0], dtype=F64),
        top_k=torch.tensor([0]),
        top_p=torch.tensor([1.0], dtype=F64),
        greedy=torch.tensor([False]),
        seeds=as_seeds([1]),
        positions=torch.tensor([0]),
    )
    return SamplingBatch(**{**fields, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [
        dict(greedy=torch.tensor([True])),  # greedy must be exactly temperature == 0
        dict(seeds=np.array([1], dtype=np.int64)),  # seeds are uint64
        dict(positions=torch.tensor([0, 1])),  # one entry per row
        dict(top_k=torch.tensor([0, 0])),
        dict(coupled=torch.tensor([False, True])),
        dict(temperature=torch.tensor([0.0], dtype=F64), greedy=torch.tensor([True]), coupled=torch.tensor([True])),
    ],
)
def test_inconsistent_batch_state_is_rejected(overrides):
    _raw_batch()  # the defaults are consistent
    with pytest.raises(AssertionError):
        _raw_batch(**overrides)


def test_select_returns_the_chosen_rows_in_order_with_their_seeds_and_positions():
    params = [SamplingParams(temperature=t, seed=s) for t, s in ((0.0, 10), (0.5, 11), (1.5, 12))]
    batch = _batch(*params, positions=[3, 4, 5])
    sub = batch.select(torch.tensor([2, 1]))
    assert sub.temperature.tolist() == [1.5, 0.5]
    assert [int(s) for s in sub.seeds] == [12, 11]
    assert sub.positions.tolist() == [5, 4]
    assert batch.select(slice(None)) is batch


def test_row_index_is_a_free_slice_when_every_row_is_selected():
    assert row_index(torch.tensor([True, True])) == slice(None)
    assert row_index(torch.tensor([False, True, True])).tolist() == [1, 2]


# --- SamplingBatch.uniforms --------------------------------------------------------------


def test_batch_uniforms_are_addressed_by_seed_position_plus_offset_and_role():
    batch = _batch(*(SamplingParams(temperature=1.0, seed=s) for s in (7, 8, 9)), positions=[0, 10, 100])
    offsets = torch.tensor([[0, 1], [2, 0], [5, 5]])
    u = batch.uniforms(offsets, ROLE_ACCEPT)
    assert u.dtype == F64 and u.shape == (3, 2)
    expected = uniforms(as_seeds([7, 8, 9]), np.array([[0, 1], [12, 10], [105, 105]]), ROLE_ACCEPT)
    assert np.array_equal(u.numpy(), expected)
    flat = batch.uniforms(torch.tensor([1, 1, 1]), ROLE_DRAFT)
    assert flat.shape == (3,)
    assert np.array_equal(flat.numpy(), uniforms(batch.seeds, np.array([1, 11, 101]), ROLE_DRAFT))


def test_batch_uniforms_need_one_offset_row_per_batch_row():
    with pytest.raises(AssertionError):
        _batch(SamplingParams(temperature=1.0)).uniforms(torch.tensor([0, 1]), ROLE_FINAL)


# --- logits_to_probs -----------------------------------------------------------------------


def test_temperature_divides_the_logits_before_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]], dtype=F64)
    for t in (0.5, 1.0, 2.0, 1e-3, 1e3):
        probs = logits_to_probs(logits, _batch(SamplingParams(temperature=t)))
        torch.testing.assert_close(probs, torch.softmax(logits / t, dim=-1), rtol=1e-12, atol=1e-15)


def test_low_temperature_sharpens_and_high_temperature_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = logits_to_probs(logits, _batch(SamplingParams(temperature=0.25)))
    hot = logits_to_probs(logits, _batch(SamplingParams(temperature=4.0)))
    plain = torch.softmax(logits, dim=-1)
    assert cold[0, 0] > plain[0, 0] > hot[0, 0]


def test_top_k_keeps_only_the_k_most_likely_tokens_renormalised():
    logits = _logits_of([0.1, 0.4, 0.2, 0.3])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2)))
    torch.testing.assert_close(probs, _probs([[0.0, 4 / 7, 0.0, 3 / 7]]))


def test_top_k_keeps_tokens_tied_with_the_kth():
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2)))
    assert (probs[0, :3] > 0).all() and probs[0, 3] == 0


def test_top_k_at_least_the_vocabulary_keeps_every_token():
    logits = torch.randn(1, 5, dtype=F64)
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=50)))
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))


def test_top_p_keeps_the_smallest_set_reaching_top_p():
    logits = _logits_of([0.15, 0.5, 0.1, 0.25])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.7)))
    # 0.5 alone is short of 0.7; 0.5 + 0.25 reaches it.
    torch.testing.assert_close(probs, _probs([[0.0, 2 / 3, 0.0, 1 / 3]]))


def test_top_p_always_keeps_the_top_token():
    logits = _logits_of([0.3, 0.4, 0.3])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.01)))
    torch.testing.assert_close(probs, _probs([[0.0, 1.0, 0.0]]))


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    logits = _logits_of([0.4, 0.3, 0.2, 0.1])
    # After top-k=2 the top token has 4/7 >= 0.5, so top-p keeps it alone; on the
    # unfiltered distribution 0.4 < 0.5 and top-p alone keeps two tokens.
    both = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2, top_p=0.5)))
    top_p_only = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.5)))
    torch.testing.assert_close(both, _probs([[1.0, 0.0, 0.0, 0.0]]))
    assert (top_p_only[0, :2] > 0).all() and (top_p_only[0, 2:] == 0).all()


def test_top_p_applies_to_the_top_k_set_including_tokens_tied_with_the_kth():
    # top-k=2 keeps all five tokens (four tie at the 2nd largest logit): [e^2, e, e, e, e] / (e^2 + 4e)
    # gives the top token 0.405 < 0.7, so top-p must keep more than the top token.
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 1.0]], dtype=F64)
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2, top_p=0.7)))
    assert (probs > 0).all()


def test_top_p_applies_after_temperature():
    logits = _logits_of([0.6, 0.4])
    cold = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.55)))
    hot = logits_to_probs(logits, _batch(SamplingParams(temperature=100.0, top_p=0.55)))
    assert cold[0, 1] == 0  # 0.6 >= 0.55 alone
    assert hot[0, 1] > 0  # flattened to about 0.501 / 0.499: needs both


def test_greedy_rows_are_one_hot_at_the_argmax_whatever_their_filters():
    logits = torch.tensor([[0.1, 3.0, 2.9], [5.0, -1.0, 0.0]])
    batch = _batch(SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, top_k=1, top_p=0.1))
    probs = logits_to_probs(logits, batch)
    assert torch.equal(probs, _probs([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_each_row_uses_its_own_parameters():
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=0.9, top_k=4, top_p=0.8),
    ]
    logits = torch.randn(len(params), 8, generator=torch.Generator().manual_seed(0))
    together = logits_to_probs(logits, SamplingBatch.from_params(params))
    for r, p in enumerate(params):
        alone = logits_to_probs(logits[r : r + 1], _batch(p))
        torch.testing.assert_close(together[r : r + 1], alone)


def test_positions_of_a_three_dimensional_input_are_processed_independently():
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=3, top_p=0.7)]
    logits = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(1))  # [B, T, V]
    batch = SamplingBatch.from_params(params)
    probs = logits_to_probs(logits, batch)
    assert probs.shape == (2, 4, 6)
    for t in range(4):
        torch.testing.assert_close(probs[:, t], logits_to_probs(logits[:, t], batch))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, F64])
def test_probabilities_are_float64_and_sum_to_one_whatever_the_logits_dtype(dtype):
    logits = torch.randn(3, 2, 16).to(dtype)
    batch = SamplingBatch.from_params([SamplingParams(temperature=t, top_p=0.9) for t in (0.0, 0.5, 1.0)])
    probs = logits_to_probs(logits, batch)
    assert probs.dtype == F64
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 2, dtype=F64), rtol=0, atol=1e-14)


def test_minus_infinity_logits_get_zero_probability():
    logits = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]])
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_k=3, top_p=0.95)):
        probs = logits_to_probs(logits, _batch(params))
        assert probs[0, 1] == 0 and probs[0, 3] == 0
        assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-14)


def test_logits_must_be_two_or_three_dimensional_with_one_row_per_batch_entry():
    batch = _batch(SamplingParams(temperature=1.0))
    with pytest.raises(AssertionError):
        logits_to_probs(torch.zeros(4), batch)
    with pytest.raises(AssertionError):
        logits_to_probs(torch.zeros(2, 4), batch)



# --- inverse_cdf_sample ------------------------------------------------------------------


def test_inverse_cdf_picks_the_token_whose_cumulative_interval_holds_u():
    probs = _probs([[0.2, 0.0, 0.5, 0.3]]).expand(4, -1)
    u = torch.tensor([0.0, 0.19, 0.2, 1 - 2**-53], dtype=F64)
    assert inverse_cdf_sample(probs, u).tolist() == [0, 0, 2, 3]


def test_inverse_cdf_accepts_unnormalised_mass_and_several_uniforms_per_row():
    probs = _probs([[2.0, 0.0, 6.0], [0.0, 1.0, 1.0]])
    u = torch.tensor([[0.2, 0.3, 0.99], [0.0, 0.49, 0.5]], dtype=F64)
    tokens = inverse_cdf_sample(probs, u)
    assert tokens.dtype == torch.int64 and tokens.tolist() == [[0, 2, 2], [1, 1, 2]]


def test_inverse_cdf_resolves_float64_differences_that_float32_cannot():
    probs = _probs([[1.0 - 1e-12, 1e-12]])
    u = torch.tensor([[1 - 2e-12, 1 - 5e-13]], dtype=F64)  # both round to 1.0 in float32
    assert inverse_cdf_sample(probs, u).tolist() == [[0, 1]]


def test_inverse_cdf_never_returns_a_token_of_zero_probability_even_at_the_end_of_the_cdf():
    probs = _probs([[0.0, 0.3, 0.7, 0.0, 0.0]]).expand(3, -1)
    # u * total can round up to the total mass; u = 1 stands in for that rounding.
    u = torch.tensor([1.0 - 2**-53, 1.0 - 2**-40, 1.0], dtype=F64)
    assert inverse_cdf_sample(probs, u).tolist() == [2, 2, 2]


def test_sampling_a_row_without_mass_is_an_error():
    with pytest.raises(ValueError):
        inverse_cdf_sample(torch.zeros(1, 3, dtype=F64), torch.tensor([0.5], dtype=F64))


def test_normalize_probs_is_float64_and_keeps_all_zero_rows_zero():
    q = normalize_probs(torch.tensor([[1.0, 3.0], [0.0, 0.0]], dtype=torch.float16))
    assert q.dtype == F64 and q.tolist() == [[0.25, 0.75], [0.0, 0.0]]


# --- sample_from_probs -------------------------------------------------------------------

SAMPLED = SamplingParams(temperature=1.0)


def _probs_rows(rows: int, vocab: int = 50, seed: int = 2) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=F64), dim=-1)


def test_sample_is_the_inverse_cdf_at_the_rows_addressed_uniform():
    probs = _probs_rows(3)
    batch = standard_rule(_batch(*(SamplingParams(temperature=1.0, seed=s) for s in (4, 5, 6)), positions=[0, 7, 30]))
    tokens = sample_from_probs(probs, batch, offset=2, role=ROLE_DRAFT)
    u = torch.from_numpy(uniforms(as_seeds([4, 5, 6]), np.array([2, 9, 32]), ROLE_DRAFT))
    assert torch.equal(tokens, inverse_cdf_sample(probs, u))


def test_sample_from_one_hot_rows_returns_their_token():
    probs = torch.eye(5, dtype=F64)[[3, 0, 4]]
    batch = _batch(SAMPLED, SAMPLED, SamplingParams(temperature=0.3, seed=1))
    assert sample_from_probs(probs, batch).tolist() == [3, 0, 4]


def test_sample_never_returns_zero_probability_tokens():
    probs = _probs([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(10_000, -1)
    tokens = sample_from_probs(probs, _batch(*[SAMPLED] * 10_000))
    assert set(tokens.tolist()) == {1, 3}


def test_a_seeded_row_depends_only_on_its_seed_and_position_not_on_its_batch():
    probs = _probs_rows(1)
    mine = SamplingParams(temperature=1.0, seed=11)
    alone = sample_from_probs(probs, _batch(mine, positions=[40]))
    crowd_probs = torch.cat([_probs_rows(3, seed=3), probs, _probs_rows(2, seed=4)])
    others = [SAMPLED, SamplingParams(temperature=0.5, seed=11), SamplingParams(), SAMPLED, SamplingParams(seed=1)]
    crowd = _batch(*others[:3], mine, *others[3:], positions=[0, 41, 40, 40, 40, 0])
    assert sample_from_probs(crowd_probs, crowd)[3] == alone[0]
    reversed_rows = torch.arange(5, -1, -1)
    crowd_reversed = crowd.select(reversed_rows)
    assert sample_from_probs(crowd_probs[reversed_rows], crowd_reversed)[2] == alone[0]


def test_the_same_seed_and_position_give_the_same_token_and_offset_moves_the_position():
    probs = _probs_rows(1, vocab=1000)
    params = SamplingParams(temperature=1.0, seed=123)
    first = [int(sample_from_probs(probs, _batch(params, positions=[t]))) for t in range(50)]
    again = [int(sample_from_probs(probs, _batch(params, positions=[t]))) for t in range(50)]
    shifted = [int(sample_from_probs(probs, _batch(params, positions=[t - 3]), offset=3)) for t in range(3, 50)]
    assert first == again and first[3:] == shifted


def test_different_positions_and_roles_give_different_draws():
    probs = _probs_rows(1, vocab=1000)
    params = SamplingParams(temperature=1.0, seed=5)
    by_position = {int(sample_from_probs(probs, _batch(params, positions=[t]))) for t in range(50)}
    assert len(by_position) > 20
    batches = [standard_rule(_batch(params, positions=[t])) for t in range(50)]
    by_role = [int(sample_from_probs(probs, batch, role=ROLE_ACCEPT)) for batch in batches]
    by_final = [int(sample_from_probs(probs, batch, role=ROLE_FINAL)) for batch in batches]
    assert by_role != by_final


def test_greedy_rows_take_the_argmax_and_use_no_randomness():
    probs = _probs([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5], [0.4, 0.35, 0.25]])
    batches = [_batch(*(SamplingParams(seed=seed + r) for r in range(3)), positions=[seed, 0, 9]) for seed in range(20)]
    state = torch.get_rng_state()
    for seed, batch in enumerate(batches):
        assert sample_from_probs(probs, batch, offset=seed).tolist() == [1, 2, 0]
    assert torch.equal(torch.get_rng_state(), state)  # the global generator was not touched
