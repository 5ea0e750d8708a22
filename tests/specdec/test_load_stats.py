"""Measurements add up across replicas and turn into QPS, α and measured cost ratios."""

import pytest

from specdec.load_stats import LoadSnapshot, RoundSample, StatsWindow, batch_bucket


@pytest.mark.parametrize("batch, bucket", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (9, 16)])
def test_batch_buckets_are_powers_of_two(batch, bucket):
    assert batch_bucket(batch) == bucket


def verify_seconds(tokens_per_seq, step=0.010, slope=0.2):
    return step * (1 + slope * (tokens_per_seq - 1))


def window_with(gammas, batch=1, draft_step=0.003, draft_overhead=0.0):
    w = StatsWindow()
    for g in gammas:
        w.add_round(RoundSample(batch, g, drafted=g, accepted=g // 2, draft_seconds=draft_overhead + draft_step * g,
                                verify_seconds=verify_seconds(g + 1), accepted_per_position=tuple([1] * (g // 2) + [0] * (g - g // 2)),
                                drafted_per_position=tuple([1] * g)))
    return w


def test_cost_ratios_are_recovered_from_timings_at_several_gammas():
    snap = LoadSnapshot.from_window(window_with([0, 2, 4, 4, 8]), 10.0, 0, 0, measured_at=0.0)
    costs = snap.cost_model(1, default_slope=0.9)
    assert costs.verify_slope == pytest.approx(0.2)
    assert costs.draft_cost == pytest.approx(0.3)


def test_one_gamma_only_uses_the_default_slope_and_still_measures_c():
    snap = LoadSnapshot.from_window(window_with([4, 4, 4]), 10.0, 0, 0, 0.0)
    costs = snap.cost_model(1, default_slope=0.2)
    assert costs.verify_slope == 0.2
    assert costs.draft_cost == pytest.approx(0.3)


def test_alpha_and_per_position_acceptance():
    snap = LoadSnapshot.from_window(window_with([4, 2]), 10.0, 0, 0, 0.0)
    assert snap.alpha == pytest.approx(3 / 6)
    assert snap.alpha_per_position == pytest.approx((1.0, 0.5, 0.0, 0.0))


def test_qps_is_arrivals_over_the_window():
    w = StatsWindow()
    w.add_arrival(25)
    assert LoadSnapshot.from_window(w, 5.0, 3, 1, 0.0).qps == 5.0


def test_windows_from_two_replicas_merge_by_addition():
    a, b = window_with([4]), window_with([2, 0])
    merged = StatsWindow()
    merged.merge(a)
    merged.merge(dict(b.sums))
    both = window_with([4, 2, 0])
    assert dict(merged.sums) == pytest.approx(dict(both.sums))


def test_nothing_drafted_means_alpha_unknown_and_no_costs_without_timings():
    snap = LoadSnapshot.from_window(StatsWindow(), 10.0, 0, 0, 0.0)
    assert snap.alpha is None and snap.cost_model(4, 0.1) is None


def test_the_nearest_measured_bucket_is_used():
    snap = LoadSnapshot.from_window(window_with([0, 4], batch=8), 10.0, 0, 0, 0.0)
    assert snap.cost_model(6, 0.5).verify_slope == pytest.approx(0.2)
    assert snap.cost_model(1, 0.5) is not None


def test_the_draft_calls_fixed_overhead_is_separated_from_its_per_step_cost():
    snap = LoadSnapshot.from_window(window_with([0, 2, 4, 8], draft_overhead=0.004), 10.0, 0, 0, 0.0)
    costs = snap.cost_model(1, default_slope=0.9)
    assert costs.draft_cost == pytest.approx(0.3)
    assert costs.draft_overhead == pytest.approx(0.4)


def test_mean_accepted_length_comes_from_the_same_window_as_alpha():
    w = StatsWindow()
    w.add_round(RoundSample(4, 3, drafted=12, accepted=6, draft_seconds=0.0, verify_seconds=0.01))
    w.add_round(RoundSample(2, 0, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.01))
    snap = LoadSnapshot.from_window(w, 10.0, 0, 0, 0.0)
    assert snap.alpha == pytest.approx(6 / 12)
    assert snap.mean_accepted_length == pytest.approx((6 + 6) / 6), "6 sequence-rounds emitted 12 tokens"
