"""emulated_served_ahead: its in-process setups (the served ones need the worker processes of
emulated_hops.py) time the verify call and the look-ahead, and the table shows every setup."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import emulated_served_ahead as bench

from specdec.models.model_paths import bundled_prompts


def test_the_in_process_setups_time_their_calls_and_the_look_ahead():
    rows = []
    for setup, ahead in (("in-process sequential", False), ("in-process look-ahead", True)):
        built, _ = bench.local_engine("h100-llama-8b-1b", slots=16, ahead=ahead)
        spent = bench.timed_verifier(built.engine.verifier)
        prompts = [built.encode(p) for p in bundled_prompts()[:2]]
        rows.append({"setup": setup, "run": 1, **bench.run(built, {}, spent, prompts, 1, 12)})
    sequential, ahead = rows
    assert sequential["verify_ms"] > 0 and sequential["proposals_waited_ms"] > 0 and "hit_rate" not in sequential
    assert ahead["verify_ms"] > 0 and ahead["look_ahead_ms"] > 0 and ahead["look_ahead_steps"] == 1.0
    assert 0.0 <= ahead["hit_rate"] <= 1.0
    table = bench.table(rows)
    assert "| in-process look-ahead |" in table and "| served look-ahead | " in table
