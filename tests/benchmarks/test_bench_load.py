"""The QPS sweep's schedule: the policies' order between repeats, how long each load is
measured, and the arguments it refuses."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_load  # noqa: E402


def test_the_policies_order_rotates_so_that_no_policy_runs_twice_in_a_row():
    """A slow minute of the machine must not hold both runs of one policy: the last run of a
    repeat is never the first of the next, and over three repeats each policy takes each place."""
    policies = ["on", "off", "auto"]
    orders = [bench_load.run_order(policies, rep) for rep in range(6)]
    assert orders[:3] == [["on", "off", "auto"], ["off", "auto", "on"], ["auto", "on", "off"]]
    played = [p for order in orders for p in order]
    assert all(a != b for a, b in zip(played, played[1:]))
    assert all(sorted(order[i] for order in orders[:3]) == sorted(policies) for i in range(3))
    two = [p for rep in range(4) for p in bench_load.run_order(["on", "auto"], rep)]
    assert all(a != b for a, b in zip(two, two[1:]))
    assert bench_load.run_order(["auto"], 3) == ["auto"]


def test_light_loads_are_measured_long_enough_for_min_requests_arrivals():
    args = argparse.Namespace(duration=12.0, min_requests=32.0)
    assert bench_load.measured_s(args, 1.0) == 32.0  # 12 s at 1 request/s held ~10 requests
    assert bench_load.measured_s(args, 4.0) == 12.0  # 48 arrivals in --duration already
    assert bench_load.measured_s(argparse.Namespace(duration=12.0, min_requests=0.0), 1.0) == 12.0


@pytest.mark.parametrize("argv", [["--qps", "0"], ["--duration", "0"], ["--repeats", "0"], ["--min-requests", "-1"]])
def test_arguments_that_cannot_measure_anything_are_refused(argv):
    with pytest.raises(SystemExit):
        bench_load.parse_args(argv)


def test_the_default_sweep_runs_light_to_past_saturation_three_times():
    args = bench_load.parse_args([])
    assert (args.qps, args.repeats, args.min_requests) == ([1.0, 4.0, 8.0, 16.0, 24.0], 3, 32.0)
