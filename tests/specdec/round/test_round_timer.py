"""A round's timings: the profile sees the round itself; the policy is charged from where
the last round ended while rows kept running (the loop's work between rounds)."""

import time

import pytest

from specdec.round.round_timer import RoundTimer


def a_round(timer: RoundTimer) -> float:
    start = time.perf_counter()
    return timer.round_done(start, start, start, 0.0, None)


def test_the_policy_is_charged_the_loops_work_since_the_last_busy_step_and_the_profile_is_not():
    timer = RoundTimer()
    timer.step_ended(time.perf_counter() - 1.0, busy=True)  # a second of the loop's work since
    timer.step_started(time.perf_counter())
    assert a_round(timer) >= 1.0
    assert timer.profile.rounds == 1 and timer.profile.round_s < 0.5
    assert a_round(timer) < 0.5  # a retried half of the same step: from its own start


def test_a_pause_with_nothing_running_is_not_charged():
    timer = RoundTimer()
    timer.step_ended(time.perf_counter() - 1.0, busy=False)
    timer.step_started(time.perf_counter())
    assert a_round(timer) < 0.5


def test_proposer_compute_adds_up_and_falls_back_to_the_wall_time():
    timer = RoundTimer()
    timer.add_propose_compute(0.010, 0.004)
    timer.add_propose_compute(0.003, None)  # the proposer reported none: its wall time
    assert timer.propose_compute_s == pytest.approx(0.007)
    timer.propose_compute_s = None  # the round's call reported nothing
    timer.add_propose_compute(0.003, None)
    assert timer.propose_compute_s is None


def test_a_rows_wait_runs_from_its_last_emission_and_stops_when_it_leaves():
    timer = RoundTimer()
    assert timer.row_waits(["a", "b"], 10.0) == (0, 0.0)  # first tokens: nothing waited yet
    assert timer.row_waits(["a"], 10.5) == (1, pytest.approx(0.5))  # b sat this round out
    assert timer.row_waits(["a", "b", "c"], 11.0) == (2, pytest.approx(0.5 + 1.0))
    timer.forget("a")
    assert timer.row_waits(["a"], 12.0) == (0, 0.0)
