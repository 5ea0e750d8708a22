"""Speculation switches off under high load and back on only well below it, without flapping."""

import pytest

from specdec.policy.load_switch import LoadSwitch, LoadThresholds

T = LoadThresholds(disable_qps=10, enable_qps=6, disable_in_flight=32, enable_in_flight=16, min_dwell_s=5)


def test_starts_enabled_and_stays_on_at_low_load():
    switch = LoadSwitch(T, T.min_dwell_s)
    assert all(switch.update(qps=q, in_flight=2, now=t) for t, q in enumerate([1, 3, 5, 9.9]))


def test_high_qps_switches_off():
    switch = LoadSwitch(T, T.min_dwell_s)
    assert switch.update(qps=12, in_flight=2, now=0.0) is False


def test_many_requests_in_flight_switch_off_even_at_low_qps():
    assert LoadSwitch(T, T.min_dwell_s).update(qps=1, in_flight=40, now=0.0) is False


def test_between_the_thresholds_the_state_is_kept():
    switch = LoadSwitch(T, T.min_dwell_s)
    switch.update(qps=12, in_flight=2, now=0.0)
    assert switch.update(qps=8, in_flight=2, now=100.0) is False  # below disable, above enable
    on = LoadSwitch(T, T.min_dwell_s)
    assert on.update(qps=8, in_flight=2, now=0.0) is True


def test_back_on_only_below_both_enable_thresholds():
    switch = LoadSwitch(T, T.min_dwell_s)
    switch.update(qps=12, in_flight=2, now=0.0)
    assert switch.update(qps=5, in_flight=20, now=10.0) is False  # in-flight still too high
    assert switch.update(qps=5, in_flight=10, now=11.0) is True


def test_minimum_dwell_time_prevents_flapping():
    switch = LoadSwitch(T, T.min_dwell_s)
    switch.update(qps=12, in_flight=0, now=0.0)
    assert switch.update(qps=0, in_flight=0, now=4.9) is False
    assert switch.update(qps=0, in_flight=0, now=5.0) is True
    assert switch.update(qps=50, in_flight=0, now=6.0) is True  # dwell again after switching on
    assert switch.update(qps=50, in_flight=0, now=10.0) is False


def test_an_oscillating_load_switches_at_most_once_per_dwell_time():
    switch = LoadSwitch(T, T.min_dwell_s)
    states = [switch.update(qps=12 if i % 2 else 2, in_flight=0, now=i * 0.5) for i in range(40)]
    switches = sum(a != b for a, b in zip(states, states[1:]))
    assert switches <= 20 * 0.5 / T.min_dwell_s * 2 + 1


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(disable_qps=5, enable_qps=6, disable_in_flight=32, enable_in_flight=16, min_dwell_s=1),
        dict(disable_qps=10, enable_qps=6, disable_in_flight=16, enable_in_flight=16, min_dwell_s=1),
        dict(disable_qps=10, enable_qps=6, disable_in_flight=32, enable_in_flight=16, min_dwell_s=-1),
    ],
)
def test_thresholds_without_a_gap_are_rejected(kwargs):
    with pytest.raises(ValueError):
        LoadThresholds(**kwargs)
