"""emulated_ahead: the in-process engine drafting ahead on emulated devices (its target verifying
on a thread of its own) beside sequential rounds; drafting ahead changes speed, never output."""

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import emulated_ahead

from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest


def test_drafting_ahead_in_process_keeps_the_greedy_output_and_hits_after_rejections():
    args = argparse.Namespace(profile="h100-llama-8b-1b", gamma=4, time_scale=0.02)
    built = emulated_ahead.engines(args, slots=16)
    prompts = [built["sequential"].encode(p) for p in bundled_prompts()[:2]]
    outputs = {label: [r.token_ids for r in b.engine.generate([GenerationRequest(p, 40) for p in prompts[:1]])]
               for label, b in built.items()}
    assert outputs["drafting ahead"] == outputs["sequential"] == outputs["look-ahead only"]
    ahead = built["look-ahead only"].engine.draft_ahead
    assert ahead.rows_ahead > 5 and ahead.rejection_hits > 0  # the draft ranks the target's token after a miss
    rows = [{"setup": label, "streams": 1, "run": 1, **emulated_ahead.run(b, prompts, 1, 16)}
            for label, b in built.items()]
    assert "| 1 | look-ahead only |" in emulated_ahead.table(rows)
