"""The in-process engine on the emulated 8B/1B pair: speculation changes speed, never output.

Greedy output equals the emulated target decoding alone, and sampled output follows the
target's distribution (a chi-squared test over the first two tokens of many requests).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_engine
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

PROFILE = "h100-llama-8b-1b"
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "x = [i * i for i in range(10)]"]


@pytest.fixture(scope="module")
def built():
    config = load_config(overrides={
        "models": {"target": f"emulated:{PROFILE}:target", "draft": f"emulated:{PROFILE}:draft",
                   "device_time_scale": 0.0},
        "cache": {"num_slots": 64, "max_seq_len": 256},
        "speculation": {"proposer": "draft", "gamma": 4},
        "load_monitor": {"enabled": False},
    })
    return build_engine(config)


def test_text_prompts_round_trip_through_the_emulated_tokenizer(built):
    ids = built.encode(PROMPTS[0])
    assert max(ids) < built.engine.verifier.vocab_size
    assert built.engine.decode(ids) == PROMPTS[0]


def test_greedy_speculation_equals_the_target_alone(built):
    prompts = [built.encode(p) for p in PROMPTS]
    alone = built.engine.generate([GenerationRequest(p, 60, gamma=0) for p in prompts])
    for gamma in (1, 4, 7):
        speculated = built.engine.generate([GenerationRequest(p, 60, gamma=gamma, mode="on") for p in prompts])
        assert [r.token_ids for r in speculated] == [r.token_ids for r in alone]
        assert all(len(r.token_ids) == 60 for r in speculated)  # no end-of-text: the budget ends them
    assert built.engine.stats.accepted > 0 and built.engine.stats.drafted > built.engine.stats.accepted


def target_pair_probs(built, prompt: list[int]) -> dict[tuple[int, int], float]:
    """The emulated target's probability of each first two generated tokens (temperature 1)."""
    runner = built.engine.verifier.runner
    slot = runner.allocate_slot()
    try:
        first = runner.forward([slot], [prompt], last_only=True)[0].double().softmax(-1)  # [V]
        pairs = {}
        for t1 in torch.nonzero(first > 1e-9).flatten().tolist():
            runner.truncate(slot, len(prompt))
            second = runner.forward([slot], [[t1]], last_only=True)[0].double().softmax(-1)  # [V]
            for t2 in torch.nonzero(second > 1e-9).flatten().tolist():
                pairs[(t1, t2)] = float(first[t1] * second[t2])
        return pairs
    finally:
        runner.free_slot(slot)


@pytest.mark.slow
def test_sampled_speculation_follows_the_targets_distribution(built):
    prompt = built.encode(PROMPTS[1])
    rounds = 6000
    requests = [GenerationRequest(prompt, 2, SamplingParams(temperature=1.0, seed=i), gamma=4, mode="on")
                for i in range(rounds)]
    observed: dict[tuple[int, int], int] = {}
    for result in built.engine.generate(requests):
        key = tuple(result.token_ids)
        observed[key] = observed.get(key, 0) + 1
    expected = target_pair_probs(built, prompt)
    assert set(observed) <= set(expected)  # nothing the target gives no probability
    cells = sorted(expected, key=expected.get, reverse=True)
    big = [c for c in cells if expected[c] * rounds >= 5]
    exp = np.array([expected[c] for c in big] + [1 - sum(expected[c] for c in big)]) * rounds
    obs = np.array([observed.get(c, 0) for c in big] + [rounds - sum(observed.get(c, 0) for c in big)])
    assert stats.chisquare(obs, exp).pvalue > 1e-4
