"""γ* maximises the seed's expected goodput; speculation is chosen only when it pays."""

import pytest

from specdec.gamma import CostModel, expected_tokens, expected_tokens_measured, goodput, optimal_gamma

FREE = CostModel(draft_cost=0.0, verify_slope=0.0)
GPU_SMALL_BATCH = CostModel(draft_cost=0.05, verify_slope=0.02)
CPU_TINY_PAIR = CostModel(draft_cost=0.31, verify_slope=0.05)
COMPUTE_BOUND = CostModel(draft_cost=0.05, verify_slope=1.0)


@pytest.mark.parametrize(
    "alpha, gamma, tokens",
    [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.5, 2, 1.75), (0.8, 4, (1 - 0.8**5) / 0.2)],
)
def test_expected_tokens_per_round(alpha, gamma, tokens):
    assert expected_tokens(alpha, gamma) == pytest.approx(tokens)


def test_plain_decoding_has_goodput_one():
    assert goodput(0.9, 0, CPU_TINY_PAIR) == 1.0


@pytest.mark.parametrize(
    "alpha, costs, gamma_max, expected",
    [
        (0.0, GPU_SMALL_BATCH, 8, 0),  # nothing is ever accepted: do not draft
        (0.02, GPU_SMALL_BATCH, 8, 0),
        (0.05, FREE, 8, 8),  # free drafting and verification: every extra token is a free lottery ticket
        (0.999, FREE, 8, 8),  # near-perfect draft: γ_max
        (0.99, GPU_SMALL_BATCH, 8, 8),
        (0.8, GPU_SMALL_BATCH, 8, 7),  # goodput 2.793 at γ = 7 vs 2.775 at 8
        (0.7, GPU_SMALL_BATCH, 16, 5),  # interior optimum, well below γ_max
        (0.56, CPU_TINY_PAIR, 8, 1),  # 1.56 tokens / 1.36 cost = 1.147 beats γ = 2 (1.089)
        (0.8, CPU_TINY_PAIR, 8, 3),
        (0.3, CPU_TINY_PAIR, 8, 0),
        (0.8, COMPUTE_BOUND, 8, 0),  # large batches: verification is not free, speculation costs throughput
        (0.98, COMPUTE_BOUND, 8, 0),
    ],
)
def test_policy_table(alpha, costs, gamma_max, expected):
    assert optimal_gamma(alpha, costs, gamma_max) == expected


def test_gamma_star_never_exceeds_gamma_max_and_grows_with_alpha():
    previous = 0
    for i in range(101):
        g = optimal_gamma(i / 100, GPU_SMALL_BATCH, 6)
        assert 0 <= g <= 6 and g >= previous
        previous = g


def test_chosen_gamma_is_at_least_as_good_as_every_other():
    for alpha in (0.1, 0.4, 0.6, 0.75, 0.9):
        g = optimal_gamma(alpha, CPU_TINY_PAIR, 8)
        assert all(goodput(alpha, g, CPU_TINY_PAIR) >= goodput(alpha, k, CPU_TINY_PAIR) for k in range(9))


def test_min_gain_keeps_marginal_speculation_off():
    alpha, costs = 0.45, CPU_TINY_PAIR
    assert optimal_gamma(alpha, costs, 8) > 0
    assert goodput(alpha, optimal_gamma(alpha, costs, 8), costs) < 1.2
    assert optimal_gamma(alpha, costs, 8, min_gain=0.2) == 0


@pytest.mark.parametrize("bad", [dict(alpha=1.5, gamma=1), dict(alpha=0.5, gamma=-1)])
def test_bad_inputs_are_rejected(bad):
    with pytest.raises(ValueError):
        expected_tokens(**bad)
    with pytest.raises(ValueError):
        CostModel(draft_cost=-0.1, verify_slope=0)


def test_measured_prefix_acceptance_gives_the_expected_tokens_directly():
    assert expected_tokens_measured((0.6, 0.5, 0.45), 3) == pytest.approx(1 + 0.6 + 0.5 + 0.45)
    assert expected_tokens_measured((0.6,), 0) == 1.0


def test_positions_past_the_measured_ones_continue_with_the_last_conditional_rate():
    # conditional rate of position 2 is 0.5 / 0.6; positions 3 and 4 keep it
    r = 0.5 / 0.6
    assert expected_tokens_measured((0.6, 0.5), 4) == pytest.approx(1 + 0.6 + 0.5 + 0.5 * r + 0.5 * r * r)
    assert expected_tokens_measured((0.7,), 3) == pytest.approx(expected_tokens(0.7, 3))


def test_correlated_acceptance_favours_a_longer_gamma_than_independent_alpha():
    # easy stretches: once the first token is accepted, the next ones usually are too
    prefix = (0.62, 0.58, 0.55, 0.52)
    alpha = sum(prefix) / (1 + 0.62 + 0.58 + 0.55)  # the per-token α such rounds report at γ = 4
    costs = CostModel(draft_cost=0.3, verify_slope=0.05)
    assert optimal_gamma(alpha, costs, 8, prefix_acceptance=prefix) > optimal_gamma(alpha, costs, 8)


def test_a_fixed_draft_call_overhead_makes_short_gammas_pay_less():
    costs = CostModel(draft_cost=0.1, verify_slope=0.02, draft_overhead=0.5)
    assert costs.round_cost(0) == 1.0 and costs.round_cost(2) == pytest.approx(1.74)
    assert goodput(0.5, 1, costs) < 1.0 < goodput(0.5, 3, costs)  # 1.5 / 1.62 vs 1.875 / 1.86
    assert optimal_gamma(0.4, costs, 8) == 0
    assert optimal_gamma(0.4, CostModel(draft_cost=0.1, verify_slope=0.02), 8) > 0  # same, no overhead
    assert optimal_gamma(0.85, costs, 8) >= 4
