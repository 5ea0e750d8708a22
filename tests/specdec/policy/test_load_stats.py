"""Measurements add up across replicas and turn into QPS, α and the measured round cost."""

import pytest

from specdec.policy.load_stats import LoadSnapshot, RoundSample, StatsWindow


def verify_seconds(rows, tokens):
    return 0.008 + 0.0005 * tokens


def window_with(gammas, batch=1, draft_step=0.003, draft_overhead=0.0):
    w = StatsWindow()
    for g in gammas:
        w.add_round(RoundSample(batch, g, drafted=g, accepted=g // 2, draft_seconds=draft_overhead + draft_step * g,
                                verify_seconds=verify_seconds(batch, batch + g),
                                accepted_per_position=tuple([1] * (g // 2) + [0] * (g - g // 2)),
                                drafted_per_position=tuple([1] * g)))
    return w


def test_the_snapshot_carries_the_round_cost_fitted_from_its_rounds():
    w = StatsWindow()
    for batch in (1, 2, 4, 8):
        for g in (0, 2, 4, 8):
            w.merge(window_with([g], batch=batch, draft_overhead=0.002))
    cost = LoadSnapshot.from_window(w, 10.0, 0, 0, measured_at=0.0).round_cost
    # no prompt read: priced as a row; verifying drafts costs nothing apart from the drafts
    assert cost.verify == pytest.approx((0.008, 0.0005, 0.0005, 0.0005, 0.0, 0.0), rel=1e-4, abs=1e-7)
    assert cost.draft_s(1, 4) == pytest.approx(0.002 + 0.003 * 4)


def test_a_round_sample_from_rows_counts_what_was_asked_and_drafted():
    sample = RoundSample.from_rows([4, 4, 0], [4, 2, 0], [3, 0, 0], 0.01, 0.02, 0.035)
    assert (sample.batch_size, sample.gamma, sample.draft_rows) == (3, 4, 2)
    assert (sample.drafted, sample.accepted) == (6, 3)
    assert sample.drafted_per_position == (2, 2, 1, 1) and sample.accepted_per_position == (1, 1, 1, 0)
    assert (sample.shape.rows, sample.shape.tokens, sample.shape.steps) == (3, 9, 4)


def test_alpha_and_per_position_acceptance():
    snap = LoadSnapshot.from_window(window_with([4, 2] * 8), 10.0, 0, 0, 0.0)
    assert snap.alpha == pytest.approx(3 / 6)
    assert snap.alpha_per_position == pytest.approx((1.0, 0.5, 0.0, 0.0))


def test_positions_drafted_too_rarely_are_left_to_extrapolation():
    """One unlucky draft at a rare position must not zero every longer γ."""
    snap = LoadSnapshot.from_window(window_with([2] * 8 + [4]), 10.0, 0, 0, 0.0)
    assert snap.alpha_per_position == pytest.approx((1.0, 1 / 9))  # position 3 drafted once only
    snap = LoadSnapshot.from_window(window_with([1] * 7), 10.0, 0, 0, 0.0)
    assert snap.alpha_per_position == () and snap.alpha == 0.0


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
    assert snap.alpha is None and snap.round_cost is None


def test_mean_accepted_length_comes_from_the_same_window_as_alpha():
    w = StatsWindow()
    w.add_round(RoundSample(4, 3, drafted=12, accepted=6, draft_seconds=0.0, verify_seconds=0.01))
    w.add_round(RoundSample(2, 0, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.01))
    snap = LoadSnapshot.from_window(w, 10.0, 0, 0, 0.0)
    assert snap.alpha == pytest.approx(6 / 12)
    assert snap.mean_accepted_length == pytest.approx((6 + 6) / 6), "6 sequence-rounds emitted 12 tokens"


def test_prompt_tokens_read_in_a_round_count_as_verified_tokens():
    sample = RoundSample.from_rows([4, 0], [4, 0], [2, 0], 0.01, 0.5, 0.52, prefill=(1, 300))
    assert sample.shape.tokens == 4 + 2 + 300
