"""bench_core --profile: the in-process engine on emulated devices, OFF beside ON at each γ."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_core
import emulated_core


@pytest.mark.slow
def test_rows_compare_speculation_with_plain_decoding_on_the_profiles_devices(capsys):
    args = argparse.Namespace(profile="h100-llama-8b-1b", streams=(1, 2), gammas=(3,), prompts=2,
                              max_new_tokens=24, time_scale=0.05)
    rows = emulated_core.measure(args, bench_core.theoretical_speedup)
    assert [(r["streams"], r["gamma"]) for r in rows] == [(1, 0), (1, 3), (2, 0), (2, 3)]
    off, on = rows[0], rows[1]
    assert off["mean_accepted_length"] == 1.0 and on["mean_accepted_length"] > 1.0
    assert 0.2 < on["alpha_1"] <= 1.0
    assert on["predicted"] == pytest.approx(bench_core.theoretical_speedup(0.7, 3, on["c"]))
    assert 0.1 < on["c"] < 0.3  # the profile's draft/target step ratio at this batch
    emulated_core.print_table(rows, args)
    assert "| 1 | ON, γ 3 |" in capsys.readouterr().out
