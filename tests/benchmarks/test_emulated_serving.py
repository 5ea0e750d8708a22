"""bench_serving --profile's arithmetic: device time per round from the emulated devices' busy
counters, the framework cost (round time beyond the devices' critical path), and the ratios."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import emulated_serving as es


def devices(draft_s: float, target_s: float, late_s: float = 0.0) -> list[dict]:
    return [{"name": "p:draft", "busy_s": draft_s, "late_s": late_s, "forwards": 1},
            {"name": "p:target", "busy_s": target_s, "late_s": 0.0, "forwards": 1}]


def test_nothing_emulated_reads_as_no_device_time():
    assert es.device_totals([]) == {}
    assert es.device_delta({}, {"rounds": 3}, {"rounds": 3, "round_ms": 9.0}) == {}


def test_sequential_rounds_pay_the_draft_and_the_verify_on_the_critical_path():
    before = {"rounds": 10, **es.device_totals(devices(1.0, 2.0, 0.1))}
    after = {"rounds": 20, **es.device_totals(devices(1.05, 2.07, 0.11))}
    found = es.device_delta(before, after, {"rounds": 10, "round_ms": 15.0, "overlapped_ms": 0.0})
    assert found["draft_device_ms"] == pytest.approx(5.0)
    assert found["target_device_ms"] == pytest.approx(7.0)
    assert found["late_ms"] == pytest.approx(1.0)
    assert found["critical_device_ms"] == pytest.approx(12.0)
    assert found["framework_ms"] == pytest.approx(3.0)


def test_drafting_ahead_takes_the_hidden_draft_time_off_the_critical_path():
    assert es.critical_device_ms(draft_ms=5.0, target_ms=7.0, overlapped_ms=3.0) == pytest.approx(9.0)
    assert es.critical_device_ms(draft_ms=5.0, target_ms=7.0, overlapped_ms=8.0) == pytest.approx(7.0)


def test_every_stream_gets_a_prompt():
    assert es.prompts_for(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    assert es.prompts_for(["a", "b", "c"], 1) == ["a", "b", "c"]


def test_ratios_pair_rows_of_the_same_run_and_streams():
    rows = [{"setup": "in-process", "run": r, "streams": 1, "tokens_per_s": 100.0 * r} for r in (1, 2, 3)]
    rows += [{"setup": es.SEQUENTIAL, "run": r, "streams": 1, "tokens_per_s": x} for r, x in ((1, 90.0), (2, 190.0),
                                                                                              (3, 240.0))]
    rows += [{"setup": es.OFF, "run": 1, "streams": 1, "tokens_per_s": 60.0}]
    [found] = es.goals(rows, [1], predicted=1.5)
    assert found["served_over_in_process"] == pytest.approx(0.9)  # median of 0.9, 0.95, 0.8
    assert found["on_over_off"] == pytest.approx(1.5)
    assert found["ahead_over_served"] != found["ahead_over_served"]  # no drafting-ahead rows: NaN


def test_the_router_replicas_own_ports_get_their_own_goal_rows():
    rows = [{"setup": "in-process", "run": 1, "streams": 8, "tokens_per_s": 100.0},
            {"setup": es.SEQUENTIAL, "run": 1, "streams": 8, "tokens_per_s": 70.0},
            {"setup": es.DIRECT[es.SEQUENTIAL], "run": 1, "streams": 8, "tokens_per_s": 90.0}]
    proxy, direct = es.goals(rows, [8], predicted=1.5)
    assert (proxy["path"], proxy["served_over_in_process"]) == ("proxy", pytest.approx(0.7))
    assert (direct["path"], direct["served_over_in_process"]) == ("direct", pytest.approx(0.9))
