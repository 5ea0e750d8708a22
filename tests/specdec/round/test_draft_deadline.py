"""DraftDeadline: a round waits for its drafts a small multiple of what drafting measures,
never less than the floor nor more than the cap; a proposer that keeps missing is down."""

from __future__ import annotations

import math
import random

import pytest

from specdec.round.draft_deadline import DraftDeadline


def test_unmeasured_the_budget_is_the_cap():
    deadline = DraftDeadline(floor_s=0.1, multiple=3.0, cap_s=0.8)
    assert deadline.p99_s() is None and deadline.budget_s() == 0.8
    assert "not measured" in deadline.describe()


def test_the_budget_is_a_multiple_of_the_p99_of_recent_calls():
    deadline = DraftDeadline(floor_s=0.01, multiple=3.0, cap_s=5.0, window=100)
    for i in range(100):
        deadline.answered(0.010 if i % 50 else 0.200)  # two slow calls in 100
    assert deadline.p99_s() == pytest.approx(0.200)
    assert deadline.budget_s() == pytest.approx(0.600)
    for _ in range(100):  # the slow calls leave the window
        deadline.answered(0.020)
    assert deadline.budget_s() == pytest.approx(0.060)


def test_the_p99_is_always_that_of_the_last_window_calls():
    rng = random.Random(5)
    deadline, answered = DraftDeadline(floor_s=0.01, cap_s=5.0, window=10), []
    for _ in range(200):
        seconds = rng.choice([-0.001, 0.01, 0.02, 0.02, rng.uniform(0, 0.5)])  # repeats, and one clamped to 0
        deadline.answered(seconds)
        answered.append(max(0.0, seconds))
        window = sorted(answered[-10:])
        assert deadline.p99_s() == window[math.ceil(0.99 * len(window)) - 1]


def test_the_floor_and_the_cap_bound_the_budget():
    deadline = DraftDeadline(floor_s=0.2, multiple=3.0, cap_s=1.0)
    deadline.answered(0.001)
    assert deadline.budget_s() == 0.2, "a fast draft still gets the floor (scheduling noise is no miss)"
    for _ in range(10):
        deadline.answered(0.9)
    assert deadline.budget_s() == 1.0, "a slow draft never gets more than the cap"


def test_a_late_answer_raises_the_budget_of_a_draft_that_got_slower_but_not_a_stopped_one():
    deadline = DraftDeadline(floor_s=0.05, multiple=2.0, cap_s=1.0)
    deadline.answered(0.02)
    assert deadline.budget_s() == 0.05
    deadline.answered_late(0.3)  # larger batches: the draft now takes longer
    assert deadline.budget_s() == pytest.approx(0.6)
    deadline.answered_late(70.0)  # answered after a SIGCONT: says nothing about drafting
    assert deadline.budget_s() == pytest.approx(0.6)


def test_misses_in_a_row_open_the_circuit_and_an_answer_in_time_ends_the_row():
    deadline = DraftDeadline(misses_to_open=3)
    assert [deadline.missed(), deadline.missed()] == [False, False]
    deadline.answered(0.01)
    assert [deadline.missed(), deadline.missed(), deadline.missed()] == [False, False, True]
    deadline.answered_late(0.01)
    assert deadline.missed(), "a late answer does not end the row"
    deadline.found_again()
    assert not deadline.missed() and deadline.missed_calls == 7


@pytest.mark.parametrize("kwargs", [{"floor_s": 0}, {"floor_s": 2.0, "cap_s": 1.0}, {"multiple": 0.5},
                                    {"window": 0}, {"misses_to_open": 0}])
def test_impossible_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        DraftDeadline(**kwargs)


def test_within_a_short_call_limit_the_floor_and_cap_shrink_to_it():
    assert (DraftDeadline.within(30.0).floor_s, DraftDeadline.within(30.0).cap_s) == (0.2, 1.0)
    short = DraftDeadline.within(0.1)
    assert short.floor_s == short.cap_s == short.budget_s() == 0.1
