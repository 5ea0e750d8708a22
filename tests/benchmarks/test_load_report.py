"""The QPS sweep's verdict: AUTO against the better fixed policy (and, stricter, against the
better one at each figure), its repeats pooled."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import load_report  # noqa: E402


def row(policy, tokens_per_s, p50, p99, qps=4.0, mean=None, done=10):
    return {"qps": qps, "policy": policy, "tokens_per_s": tokens_per_s, "itl_p50_ms": p50, "itl_p99_ms": p99,
            "itl_mean_ms": (p50 + p99) / 4 if mean is None else mean, "sent": 10, "completed": done,
            "rejected": 10 - done, "failed": 0, "speculated_fraction": 1.0 if policy != "off" else 0.0}


def test_where_both_serve_the_load_the_better_policy_streams_faster_on_average():
    rows = [row("on", 92, 10.0, 50.0, mean=12.0), row("off", 100, 15.0, 30.0, mean=15.0),
            row("auto", 99, 10.5, 52.0)]
    _, (c,) = load_report.closeness(rows)
    assert c["better"] == "on"  # every request answered either way; ON's answers stream faster
    assert c["auto_itl_p50_ms_ratio"] == pytest.approx(10.5 / 10.0)
    assert c["auto_itl_p99_ms_ratio"] == pytest.approx(52.0 / 50.0)
    assert c["goals_met"]
    rows[2] = row("auto", 99, 12.0, 52.0)  # 1.2x ON's p50
    assert not load_report.closeness(rows)[1][0]["goals_met"]


def test_past_saturation_the_better_policy_has_more_throughput():
    rows = [row("on", 90, 10.0, 50.0, mean=12.0, done=6), row("off", 100, 15.0, 30.0, mean=15.0, done=7),
            row("auto", 99, 15.0, 31.0)]
    _, (c,) = load_report.closeness(rows)
    assert c["better"] == "off"
    assert c["auto_tokens_per_s_ratio"] == pytest.approx(0.99)
    assert c["goals_met"]


def test_per_figure_auto_must_match_on_at_p50_and_off_at_p99_where_each_wins_one():
    rows = [row("on", 100, 10.0, 50.0), row("off", 100, 15.0, 30.0), row("auto", 99, 10.5, 32.0)]
    _, (c,) = load_report.closeness(rows)
    assert c["best_by_figure"][1:] == ["on", "off"]
    assert c["auto_over_best_by_figure"]["itl_p50_ms"] == pytest.approx(10.5 / 10.0)
    assert c["auto_over_best_by_figure"]["itl_p99_ms"] == pytest.approx(32.0 / 30.0)
    assert c["goals_met_per_figure"]
    rows[2] = row("auto", 99, 10.5, 40.0)  # ON's tail: 1.33x OFF's p99
    assert not load_report.closeness(rows)[1][0]["goals_met_per_figure"]


def test_each_ratio_carries_its_range_over_the_repeats():
    on, off = row("on", 100, 10.0, 50.0, mean=20.0), row("off", 100, 15.0, 30.0, mean=10.0)  # OFF is better
    repeats = [[on, off, row("auto", 100, 18.0, 30.0)], [on, off, row("auto", 100, 13.5, 45.0)]]
    pooled = [on, off, row("auto", 100, 15.75, 36.0)]
    table, (c,) = load_report.closeness(pooled, repeats)
    assert c["better"] == "off"
    assert c["auto_itl_p50_ms_ratio_range"] == pytest.approx([0.9, 1.2])
    assert c["auto_itl_p99_ms_ratio_range"] == pytest.approx([1.0, 1.5])
    assert "1.05 (0.90–1.20)" in table


def test_a_point_pools_every_measured_request_of_its_runs():
    def run(itl, tokens_at, latency):
        res = load_report.RequestResult(arrival=7.0, measured=True, tokens=len(tokens_at), done=True, latency=latency)
        res.itl, res.chunks = list(itl), [(t, 1) for t in tokens_at]
        warm = load_report.RequestResult(arrival=1.0, measured=False, done=True)  # in the warm-up: not counted
        warm.itl = [9.9]
        return [res, warm], []

    runs = [run([0.010, 0.010], [6.5, 7.0, 8.0], 0.2), run([0.030], [7.0, 30.0], 0.4)]
    point = load_report.summarize(4.0, "off", runs, warmup=6.0, duration=10.0)
    assert (point["runs"], point["sent"], point["completed"]) == (2, 2, 2)
    assert point["tokens_per_s"] == pytest.approx(4 / (2 * 10.0))  # tokens streamed in the measured 10 s of each run
    assert point["itl_p50_ms"] == pytest.approx(10.0)
    assert point["itl_mean_ms"] == pytest.approx(1000 * 0.050 / 3)
    assert point["latency_mean_ms"] == pytest.approx(300.0)  # the whole answers, first token included


def test_the_verdict_shows_what_the_itl_leaves_out_the_wait_for_the_first_token():
    """ON streams faster once the answer started, but its requests wait longer for their first
    token: the table shows both ratios beside each other (the verdict stays on the mean ITL)."""
    rows = [dict(row("on", 100, 10.0, 50.0, mean=12.0), latency_mean_ms=700.0),
            dict(row("off", 100, 15.0, 30.0, mean=15.0), latency_mean_ms=700.0), row("auto", 100, 10.0, 50.0)]
    table, (c,) = load_report.closeness(rows)
    assert c["on_over_off_itl_mean"] == pytest.approx(0.8) and c["on_over_off_latency_mean"] == pytest.approx(1.0)
    assert c["better"] == "on" and "| 0.80 | 1.00 | on |" in table
