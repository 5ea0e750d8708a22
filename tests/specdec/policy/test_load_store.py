"""The in-process load store: the last window_s seconds of load; the cost model and acceptance over cost_window_s."""

import pytest

from specdec.policy.load_stats import RoundSample, StatsWindow
from specdec.policy.load_store import InProcessLoadStore

D_FIXED, D_STEP = 0.008, 0.001  # the draft call's true cost: fixed + per step, seconds


def rounds(gammas, arrivals=0):
    """One replica's delta: a round per γ (one row), timed with the true draft cost."""
    w = StatsWindow()
    w.add_arrival(arrivals)
    for g in gammas:
        w.add_round(RoundSample(1, g, g, g // 2, D_FIXED + D_STEP * g, 0.010 + 0.0002 * (g + 1),
                                tuple([1] * (g // 2) + [0] * (g - g // 2)), tuple([1] * g), 1, 0.0))
    return w


def test_the_cost_model_and_acceptance_outlive_the_load_window():
    store = InProcessLoadStore(window_s=4.0, bucket_s=1.0, cost_window_s=60.0)
    store.push("r", rounds([1, 2, 4, 8] * 8, arrivals=10), at=1000.0, in_flight=1, queued=0)
    later = store.snapshot(1010.0)  # the load window is empty, the cost window is not
    assert later.qps == 0.0 and later.mean_batch == 0.0
    assert later.alpha == pytest.approx(7 / 15) and later.drafted == 15 * 8  # γ // 2 of γ accepted
    assert later.round_cost is not None
    assert later.round_cost.draft_s(1, 8) == pytest.approx(D_FIXED + 8 * D_STEP, rel=1e-3)
    forgotten = store.snapshot(1000.0 + 60.0 + 12.0)  # past the cost window
    assert forgotten.round_cost is None and forgotten.alpha is None


def test_seconds_of_rounds_at_one_gamma_do_not_undo_what_the_minute_measured():
    """The last few seconds drafted γ = 4 only, which cannot separate the draft call's fixed
    cost from its steps'. Fitted on the load window alone, γ = 1 is mispredicted; fitted on
    the cost window, which also saw γ = 1 … 8 earlier, it is not."""
    history, recent = rounds([1, 2, 4, 8] * 8), rounds([4] * 40)
    long, short = InProcessLoadStore(4.0, 1.0, cost_window_s=60.0), InProcessLoadStore(4.0, 1.0)
    for store in (long, short):
        store.push("r", history, at=1000.0, in_flight=1, queued=0)
        store.push("r", recent, at=1040.0, in_flight=1, queued=0)
    fitted = long.snapshot(1041.0).round_cost
    assert fitted.draft_s(1, 1) == pytest.approx(D_FIXED + D_STEP, rel=0.02)
    assert fitted.draft_s(1, 8) == pytest.approx(D_FIXED + 8 * D_STEP, rel=0.02)
    window_only = short.snapshot(1041.0).round_cost
    assert window_only.draft_s(1, 4) == pytest.approx(D_FIXED + 4 * D_STEP, rel=0.02)  # what it saw
    assert abs(window_only.draft_s(1, 1) / (D_FIXED + D_STEP) - 1) > 0.1  # what it could not tell


def test_load_figures_still_come_from_the_short_window():
    store = InProcessLoadStore(window_s=4.0, bucket_s=1.0, cost_window_s=60.0)
    store.push("r", rounds([4] * 16, arrivals=40), at=1000.0, in_flight=3, queued=0)
    store.push("r", rounds([2] * 8, arrivals=8), at=1030.0, in_flight=1, queued=0)
    snap = store.snapshot(1030.5)
    assert snap.qps == pytest.approx(8 / 4.0)
    assert snap.mean_batch == pytest.approx(1.0)


def test_one_hard_request_in_the_load_window_does_not_set_the_deployments_acceptance():
    """At 1 request/s a few seconds hold one or two requests. A minute of drafts accepted at
    0.75, then 4 s of one request's drafts at 0.25: the policy plans fresh requests with the
    minute's α (weighed by drafts), not with that request's; its per-position figures too."""
    def drafts(count, accepted_of_4):
        w = StatsWindow()
        for _ in range(count):
            w.add_round(RoundSample(1, 4, 4, accepted_of_4, 0.01, 0.01,
                                    tuple([1] * accepted_of_4 + [0] * (4 - accepted_of_4)),
                                    (1, 1, 1, 1), 1, 0.02))
        return w
    store = InProcessLoadStore(window_s=4.0, bucket_s=1.0, cost_window_s=60.0)
    for second in range(0, 50, 2):
        store.push("r", drafts(10, 3), at=1010.0 + second, in_flight=1, queued=0)
    store.push("r", drafts(20, 1), at=1062.0, in_flight=1, queued=0)
    snap = store.snapshot(1063.0)
    assert snap.alpha == pytest.approx((250 * 3 + 20 * 1) / (270 * 4))
    assert snap.alpha_per_position[0] == pytest.approx(1.0)
    assert snap.alpha_per_position[1] == pytest.approx(250 / 270)
    assert snap.drafted == 270 * 4


def test_a_cost_window_shorter_than_the_load_window_is_the_load_window():
    store = InProcessLoadStore(window_s=10.0, bucket_s=1.0, cost_window_s=2.0)
    assert store.cost_window_s == 10.0
