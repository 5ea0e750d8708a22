"""Seeded and greedy output on the emulated 8B/1B pair, pinned: a change to the draft's loop,
the sampler or the verifier's host work may change speed, never these tokens.

test_engine_seeded_output checks that speculation ON and OFF agree; a change that moved both
the same way (the sampler's float64 path, q, the coupled noise) would still pass it, so the
tokens themselves are pinned here (recorded at ccd3948). The emulated models are seeded
tables, so the tokens do not depend on the machine.
"""

from __future__ import annotations

import pytest

from specdec.config.config import load_config
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.wiring.engine_builder import build_engine

PROFILE = "h100-llama-8b-1b"
SAMPLINGS = [SamplingParams(temperature=1.0, seed=7),
             SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=2**63 + 3),
             SamplingParams(temperature=1.3, top_p=0.8, seed=11),
             SamplingParams(temperature=0.0)]
PINNED = [
    [297, 483, 52, 32, 414, 377, 337, 1, 42, 90, 444, 85, 87, 268, 482, 422, 293, 476, 353, 398, 502, 437, 304, 379],
    [431, 434, 198, 268, 490, 344, 404, 470, 480, 426, 68, 277, 350, 376, 354, 73, 377, 391, 392, 406, 466, 297,
     461, 3],
    [297, 483, 52, 4, 429, 343, 284, 300, 483, 259, 266, 78, 329, 274, 90, 383, 367, 279, 62, 54, 315, 283, 65, 407],
    [431, 434, 198, 268, 490, 344, 404, 470, 395, 323, 74, 406, 319, 53, 328, 403, 392, 446, 59, 291, 46, 477, 466,
     283],
]


@pytest.fixture(scope="module")
def built():
    return build_engine(load_config(overrides={
        "models": {"target": f"emulated:{PROFILE}:target", "draft": f"emulated:{PROFILE}:draft",
                   "device_time_scale": 0.0},
        "cache": {"num_slots": 16, "max_seq_len": 256},
        "speculation": {"proposer": "draft", "gamma": 4},
        "load_monitor": {"enabled": False},
    }))


@pytest.mark.parametrize("mode", ["on", "off"])
def test_seeded_sampled_and_greedy_rows_decode_the_pinned_tokens(built, mode):
    prompts = [built.encode(p) for p in ("def fibonacci(n):", "The quick brown fox")]
    requests = [GenerationRequest(prompts[i % 2], 24, sampling, ignore_eos=True, mode=mode)
                for i, sampling in enumerate(SAMPLINGS)]
    results = built.engine.generate(requests)
    assert [r.token_ids for r in results] == PINNED
    if mode == "on":
        assert sum(r.stats.drafted for r in results) > 0  # the draft's path ran
