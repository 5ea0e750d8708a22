"""SLO attainment in the QPS sweep: a request's TPOT as DistServe defines it, attainment over
every measured request (failures miss), and AUTO's goodput verdict against the better fixed
policy (the higher attainment)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from load_report import RequestResult  # noqa: E402
from bench_serving import percentile  # noqa: E402
from slo_report import request_tpot_s, slo_fields, slo_table  # noqa: E402


def done(tokens, ttft, latency):
    return RequestResult(arrival=0.0, measured=True, tokens=tokens, ttft=ttft, latency=latency, done=True)


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it():
    assert request_tpot_s(done(11, 0.5, 1.5)) == pytest.approx(0.1)
    assert request_tpot_s(done(1, 0.5, 0.5)) == 0.0, "one token: no gaps"
    assert math.isnan(request_tpot_s(RequestResult(0.0, True, error="RESOURCE_EXHAUSTED")))


def test_attainment_counts_every_measured_request_and_failures_miss():
    measured = [done(11, 0.1, 1.1), done(11, 0.1, 0.6), done(11, 0.9, 1.4), RequestResult(0.0, True, error="x")]
    f = slo_fields(measured, tpot_target_ms=60.0, ttft_target_ms=None)  # TPOTs: 100, 50, 50 ms
    assert f["tpot_attainment"] == pytest.approx(2 / 4) and f["slo_attainment"] == pytest.approx(2 / 4)
    both = slo_fields(measured, tpot_target_ms=60.0, ttft_target_ms=500.0)  # the third starts too late
    assert both["ttft_attainment"] == pytest.approx(2 / 4) and both["slo_attainment"] == pytest.approx(1 / 4)
    assert slo_fields(measured, None, None)["slo_attainment"] is None


def test_tpot_scatter_is_the_normal_scatter_of_the_finished_requests_above_their_median():
    measured = [done(11, 0.1, 0.1 + t / 100) for t in range(40, 61)] + [RequestResult(0.0, True, error="x")]
    tpots = [float(t) for t in range(40, 61)]  # ms; the failed request has none
    expected = (percentile(tpots, 90) - percentile(tpots, 50)) / 1.2816 / percentile(tpots, 50)
    assert slo_fields(measured, None, None)["tpot_scatter"] == pytest.approx(expected, rel=1e-3)
    stalled = measured[:-1] + [done(11, 0.1, 10.0)]  # one request stalls: p90 barely moves
    assert slo_fields(stalled, None, None)["tpot_scatter"] == pytest.approx(expected, rel=0.2)
    fast_start = [done(11, 0.1, 0.1 + t / 100) for t in (5, 10, 15)] + measured[3:]  # a light start: below the median
    assert slo_fields(fast_start, None, None)["tpot_scatter"] == pytest.approx(expected, rel=0.1)
    assert math.isnan(slo_fields(measured[:1], None, None)["tpot_scatter"]), "one request: no scatter"


def point(policy, tokens_per_s, attainment, qps=8.0):
    return {"qps": qps, "policy": policy, "tokens_per_s": tokens_per_s, "tpot_p50_ms": 10.0,
            "slo_attainment": attainment}


def test_auto_is_judged_against_the_fixed_policy_with_the_higher_attainment():
    rows = [point("on", 900, 0.95), point("off", 1000, 0.80), point("auto", 880, 0.95)]
    table, (v,) = slo_table(rows)
    assert v["better"] == "on" and v["auto_tokens_per_s_ratio"] == pytest.approx(880 / 900) and v["goal_met"]
    rows[2] = point("auto", 1000, 0.90)  # more tokens/s, fewer requests within their target
    assert not slo_table(rows)[1][0]["goal_met"]
    rows[2] = point("auto", 850, 0.99)  # within every target, but under 0.95x the tokens/s
    assert not slo_table(rows)[1][0]["goal_met"]
    assert "| 8 | 900 / 1000 / 880 |" in table


def test_without_targets_there_is_no_slo_verdict():
    rows = [point("on", 900, None), point("off", 1000, None), point("auto", 880, None)]
    assert slo_table(rows) == ("", [])


def test_the_spread_table_pairs_auto_with_the_better_policy_within_each_repeat():
    from slo_report import slo_spread

    def repeat(on, off, auto):
        return [point("on", 900, on, 16.0), point("off", 900, off, 16.0), point("auto", 900, auto, 16.0)]

    noisy = [repeat(0.5, 0.9, 0.8), repeat(0.4, 0.1, 0.2)]  # OFF 90 % then 10 %: AUTO tracks the machine
    pooled = repeat(0.45, 0.5, 0.5)
    table, (v,) = slo_spread(pooled, noisy)
    assert v["better"] == "off" and v["paired_gaps"] == pytest.approx([-0.1, 0.1])
    assert v["attainment_range"]["off"] == pytest.approx((0.1, 0.9)) and v["verdict"] == "met"
    short = repeat(0.45, 0.5, 0.4)  # pooled 10 points short, the repeats disagree: not beyond the noise
    assert slo_spread(short, noisy)[1][0]["verdict"] == "within noise"
    steady = [repeat(0.5, 0.9, 0.7), repeat(0.4, 0.8, 0.62)]  # 20 points short in both repeats
    assert slo_spread(short, steady)[1][0]["verdict"] == "missed"
    assert "| 16 | 45% / 50% / 40% |" in slo_spread(short, steady)[0]
    assert slo_spread(pooled, [])[1][0]["paired_gaps"] == []


def test_a_shortfall_with_one_repeat_is_a_miss_no_noise_was_measured():
    from slo_report import slo_spread

    one = [point("on", 900, 0.9, 16.0), point("off", 900, 0.5, 16.0), point("auto", 900, 0.8, 16.0)]
    assert slo_spread(one, [one])[1][0]["verdict"] == "missed"


def test_auto_with_and_without_its_target_side_by_side():
    from slo_report import target_effect

    rep = [point("auto", 900, 0.4), point("auto-free", 950, 0.6)]
    table = target_effect(rep, [rep, rep])
    assert "| 8 | 40% / 60% |" in table and "-20 to -20 pp" in table
    assert target_effect([point("auto", 900, 0.4)], []) == ""


def test_a_load_where_no_policy_meets_the_target_is_void_not_met():
    from slo_report import slo_spread

    none = [point("on", 900, 0.0, 24.0), point("off", 900, 0.0, 24.0), point("auto", 700, 0.0, 24.0)]
    assert slo_spread(none, [none, none])[1][0]["verdict"].startswith("void")
