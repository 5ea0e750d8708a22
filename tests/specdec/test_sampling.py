"""Specification of specdec.sampling: turning logits into processed probabilities and
drawing tokens with per-row random generators."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.sampling import (
    SamplingBatch,
    inverse_cdf_sample,
    logits_to_probs,
    row_index,
    sample_from_probs,
    uniform,
)
from specdec.sampling_params import SamplingParams


def _batch(*params: SamplingParams) -> SamplingBatch:
    return SamplingBatch.from_params(list(params))


def _logits_of(probs: list[float]) -> torch.Tensor:
    """[1, V] logits whose softmax at temperature 1 is `probs`."""
    return torch.tensor([probs]).log()


def _generator_state_after(seed: int, draws: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if draws:
        torch.rand(draws, generator=g)
    return g.get_state()


# --- SamplingBatch -----------------------------------------------------------------------


def test_from_params_builds_one_entry_per_row():
    batch = _batch(
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3),
    )
    assert batch.batch_size == 2
    assert batch.temperature.tolist() == pytest.approx([0.0, 0.7])
    assert batch.temperature.dtype == torch.float32
    assert batch.top_k.tolist() == [0, 5] and batch.top_k.dtype == torch.int64
    assert batch.top_p.tolist() == pytest.approx([1.0, 0.9]) and batch.top_p.dtype == torch.float32
    assert batch.greedy.tolist() == [True, False]


def test_from_params_seeds_a_generator_per_seeded_row_and_none_otherwise():
    batch = _batch(SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, seed=3))
    assert batch.generators[0] is None
    assert torch.equal(batch.generators[1].get_state(), torch.Generator().manual_seed(3).get_state())


def test_from_params_keeps_the_callers_generators():
    mine = torch.Generator().manual_seed(9)
    batch = SamplingBatch.from_params([SamplingParams(temperature=1.0, seed=1)], [mine])
    assert batch.generators[0] is mine


def test_all_greedy_is_true_only_when_every_row_has_temperature_zero():
    assert _batch(SamplingParams(), SamplingParams()).all_greedy
    assert not _batch(SamplingParams(), SamplingParams(temperature=0.5)).all_greedy


def test_greedy_flag_must_match_temperature_zero():
    with pytest.raises(AssertionError):
        SamplingBatch(
            temperature=torch.tensor([1.0]),
            top_k=torch.tensor([0]),
            top_p=torch.tensor([1.0]),
            greedy=torch.tensor([True]),
            generators=[None],
        )


def test_select_returns_the_chosen_rows_in_order_with_their_generators():
    g = torch.Generator()
    batch = SamplingBatch.from_params(
        [SamplingParams(temperature=t) for t in (0.0, 0.5, 1.5)], [None, g, None]
    )
    sub = batch.select(torch.tensor([2, 1]))
    assert sub.temperature.tolist() == pytest.approx([1.5, 0.5])
    assert sub.generators == [None, g]
    assert batch.select(slice(None)) is batch


def test_row_index_is_a_free_slice_when_every_row_is_selected():
    assert row_index(torch.tensor([True, True])) == slice(None)
    assert row_index(torch.tensor([False, True, True])).tolist() == [1, 2]


# --- logits_to_probs -----------------------------------------------------------------------


def test_temperature_divides_the_logits_before_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    for t in (0.5, 1.0, 2.0):
        probs = logits_to_probs(logits, _batch(SamplingParams(temperature=t)))
        torch.testing.assert_close(probs, torch.softmax(logits / t, dim=-1))


def test_low_temperature_sharpens_and_high_temperature_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = logits_to_probs(logits, _batch(SamplingParams(temperature=0.25)))
    hot = logits_to_probs(logits, _batch(SamplingParams(temperature=4.0)))
    plain = torch.softmax(logits, dim=-1)
    assert cold[0, 0] > plain[0, 0] > hot[0, 0]


def test_top_k_keeps_only_the_k_most_likely_tokens_renormalised():
    logits = _logits_of([0.1, 0.4, 0.2, 0.3])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2)))
    torch.testing.assert_close(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


def test_top_k_keeps_tokens_tied_with_the_kth():
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2)))
    assert (probs[0, :3] > 0).all() and probs[0, 3] == 0


def test_top_k_at_least_the_vocabulary_keeps_every_token():
    logits = torch.randn(1, 5)
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=50)))
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))


def test_top_p_keeps_the_smallest_set_reaching_top_p():
    logits = _logits_of([0.15, 0.5, 0.1, 0.25])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.7)))
    # 0.5 alone is short of 0.7; 0.5 + 0.25 reaches it.
    torch.testing.assert_close(probs, torch.tensor([[0.0, 2 / 3, 0.0, 1 / 3]]))


def test_top_p_always_keeps_the_top_token():
    logits = _logits_of([0.3, 0.4, 0.3])
    probs = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.01)))
    torch.testing.assert_close(probs, torch.tensor([[0.0, 1.0, 0.0]]))


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    logits = _logits_of([0.4, 0.3, 0.2, 0.1])
    # After top-k=2 the top token has 4/7 >= 0.5, so top-p keeps it alone; on the
    # unfiltered distribution 0.4 < 0.5 and top-p alone keeps two tokens.
    both = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_k=2, top_p=0.5)))
    top_p_only = logits_to_probs(logits, _batch(SamplingParams(temperature=1.0, top_p=0.5)))
    torch.testing.assert_close(both, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert (top_p_only[0, :2] > 0).all() and (top_p_only[0, 2:] == 0).all()


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
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


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


def test_probabilities_are_float32_and_sum_to_one_for_half_precision_logits():
    logits = torch.randn(3, 2, 16).to(torch.bfloat16)
    batch = SamplingBatch.from_params([SamplingParams(temperature=t, top_p=0.9) for t in (0.0, 0.5, 1.0)])
    probs = logits_to_probs(logits, batch)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 2))


def test_minus_infinity_logits_get_zero_probability():
    logits = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]])
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_k=3, top_p=0.95)):
        probs = logits_to_probs(logits, _batch(params))
        assert probs[0, 1] == 0 and probs[0, 3] == 0
        assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)


def test_logits_must_be_two_or_three_dimensional_with_one_row_per_batch_entry():
    batch = _batch(SamplingParams(temperature=1.0))
    with pytest.raises(AssertionError):
        logits_to_probs(torch.zeros(4), batch)
    with pytest.raises(AssertionError):
        logits_to_probs(torch.zeros(2, 4), batch)


# --- uniform -----------------------------------------------------------------------------


def test_uniform_has_the_requested_shape_and_range():
    u = uniform(1000, 3, [None] * 1000)
    assert u.shape == (1000, 3) and u.dtype == torch.float32
    assert (u >= 0).all() and (u < 1).all()


def test_uniform_seeded_row_draws_only_from_its_own_generator():
    gens = [None, torch.Generator().manual_seed(5), None, torch.Generator().manual_seed(6)]
    u = uniform(4, 3, gens)
    assert torch.equal(u[1], torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(u[3], torch.rand(3, generator=torch.Generator().manual_seed(6)))


def test_uniform_rows_without_generator_follow_the_global_rng():
    torch.manual_seed(123)
    first = uniform(3, 2, [None, None, None])
    torch.manual_seed(123)
    assert torch.equal(first, uniform(3, 2, [None, None, None]))


def test_uniform_needs_one_generator_per_row():
    with pytest.raises(AssertionError):
        uniform(2, 1, [None])


# --- inverse_cdf_sample / sample_from_probs ----------------------------------------------


def test_inverse_cdf_picks_the_token_whose_cumulative_interval_holds_u():
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]]).expand(4, -1)
    u = torch.tensor([0.0, 0.19, 0.2, 0.9999999])
    assert inverse_cdf_sample(probs, u).tolist() == [0, 0, 2, 3]


def test_inverse_cdf_accepts_unnormalised_mass():
    probs = torch.tensor([[2.0, 0.0, 6.0]])
    assert inverse_cdf_sample(probs, torch.tensor([0.2])).tolist() == [0]
    assert inverse_cdf_sample(probs, torch.tensor([0.3])).tolist() == [2]


def test_inverse_cdf_never_returns_a_token_of_zero_probability_even_at_the_end_of_the_cdf():
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0]]).expand(2, -1)
    # u * total can round up to the total mass; u = 1 stands in for that rounding.
    u = torch.tensor([1.0 - 2**-24, 1.0])
    assert inverse_cdf_sample(probs, u).tolist() == [2, 2]


def test_sampling_a_row_without_mass_is_an_error():
    with pytest.raises(ValueError):
        inverse_cdf_sample(torch.zeros(1, 3), torch.tensor([0.5]))


def test_sample_from_one_hot_rows_returns_their_token():
    probs = torch.eye(5)[[3, 0, 4]]
    assert sample_from_probs(probs, [None, None, torch.Generator()]).tolist() == [3, 0, 4]


def test_sample_never_returns_zero_probability_tokens():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0]).expand(10_000, -1)
    tokens = sample_from_probs(probs, [None] * 10_000)
    assert set(tokens.tolist()) == {1, 3}


def test_sample_seeded_row_depends_only_on_its_seed():
    probs = torch.softmax(torch.randn(1, 50, generator=torch.Generator().manual_seed(2)), dim=-1)
    alone = sample_from_probs(probs, [torch.Generator().manual_seed(11)])
    crowd_probs = torch.cat([torch.rand(3, 50), probs, torch.rand(2, 50)])
    crowd_gens = [None, torch.Generator().manual_seed(1), None, torch.Generator().manual_seed(11), None, None]
    crowd = sample_from_probs(crowd_probs, crowd_gens)
    assert crowd[3] == alone[0]


def test_sample_consumes_exactly_one_uniform_per_sampled_row():
    g = torch.Generator().manual_seed(4)
    sample_from_probs(torch.full((1, 6), 1 / 6), [g])
    assert torch.equal(g.get_state(), _generator_state_after(4, 1))


def test_sample_greedy_rows_take_the_argmax_and_consume_no_randomness():
    g_greedy, g_sampled = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5]])
    tokens = sample_from_probs(probs, [g_greedy, g_sampled], greedy=torch.tensor([True, False]))
    assert tokens[0] == 1
    assert torch.equal(g_greedy.get_state(), _generator_state_after(1, 0))
    assert torch.equal(g_sampled.get_state(), _generator_state_after(2, 1))
