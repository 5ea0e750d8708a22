"""The policy: fallback γ without fresh data, off under load, γ* otherwise, request overrides on top."""

import pytest

from specdec.load_stats import LoadSnapshot, RoundSample, StatsWindow
from specdec.load_switch import LoadThresholds
from specdec.speculation_policy import Decision, PolicySettings, SpeculationPolicy

SETTINGS = PolicySettings(
    gamma_max=8, fallback_gamma=2, stale_after_s=5.0, min_gain=0.0, default_verify_slope=0.05,
    thresholds=LoadThresholds(disable_qps=10, enable_qps=5, disable_in_flight=64, enable_in_flight=32, min_dwell_s=0),
)


def snapshot(qps=1.0, accepted_of_4=3, at=100.0, in_flight=1):
    w = StatsWindow()
    w.add_arrival(int(qps * 10))
    for g in (0, 4):
        w.add_round(RoundSample(1, g, g, min(g, accepted_of_4), 0.0005 * g, 0.010 * (1 + 0.05 * g)))
    return LoadSnapshot.from_window(w, 10.0, in_flight, 0, measured_at=at)


def test_missing_or_stale_measurements_fall_back_to_the_safe_gamma():
    policy = SpeculationPolicy(SETTINGS)
    assert policy.decide(None, 1, now=100.0).gamma == 2
    assert policy.decide(snapshot(at=90.0), 1, now=100.0).gamma == 2


def test_high_acceptance_and_cheap_drafts_choose_a_long_gamma():
    d = SpeculationPolicy(SETTINGS).decide(snapshot(accepted_of_4=4), 1, now=100.0)
    assert d.enabled and d.gamma == 8


def test_poor_acceptance_chooses_plain_decoding():
    d = SpeculationPolicy(SETTINGS).decide(snapshot(accepted_of_4=0), 1, now=100.0)
    assert d.enabled and d.gamma == 0


def test_high_qps_switches_speculation_off_and_low_qps_back_on():
    policy = SpeculationPolicy(SETTINGS)
    off = policy.decide(snapshot(qps=20), 1, now=100.0)
    assert (off.gamma, off.enabled) == (0, False) and "load high" in off.reason
    assert policy.decide(snapshot(qps=7), 1, now=101.0).enabled is False  # hysteresis band
    assert policy.decide(snapshot(qps=1), 1, now=102.0).enabled is True


@pytest.mark.parametrize(
    "decision_gamma, mode, requested, expected",
    [
        (4, "off", 6, 0),
        (0, "on", 6, 6),
        (0, "on", None, 3),  # ON without a γ: the configured γ even when the policy says 0
        (5, "on", None, 3),  # ... and whatever γ* the policy would choose

        (4, "auto", None, 4),
        (4, "auto", 6, 6),
        (0, "auto", 6, 0),  # AUTO follows the load switch even with a fixed γ
        (4, "auto", 0, 0),  # γ 0 means no speculation in any mode
        (4, "on", 0, 0),
    ],
)
def test_request_overrides(decision_gamma, mode, requested, expected):
    decision = Decision(decision_gamma, decision_gamma > 0, "")
    assert SpeculationPolicy.gamma_for_request(decision, mode, requested, default_gamma=3) == expected


def test_an_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode"):
        SpeculationPolicy.gamma_for_request(Decision(1, True, ""), "sometimes", None, 3)
