"""One assembly of the engine from config; it stops where transformers' generate() stops."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_engine, eos_token_ids
from specdec.models.model_paths import resolve_model_path
from specdec.requests.request import GenerationRequest


@pytest.fixture
def checkpoint(tmp_path):
    """A copy of the bundled target whose generation_config.json we may rewrite."""
    path = tmp_path / "target"
    shutil.copytree(resolve_model_path("bundled:target"), path)
    return path


def _set_generation_eos(path, value) -> None:
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = value
    (path / "generation_config.json").write_text(json.dumps(config))


def test_every_eos_id_of_generation_config_stops_generation(checkpoint):
    """Instruct models often list several end-of-sequence ids."""
    _set_generation_eos(checkpoint, [0, 17, 42])
    assert eos_token_ids(str(checkpoint), SimpleNamespace(eos_token_id=0)) == (0, 17, 42)


def test_a_single_eos_id_and_the_tokenizers_own_are_merged(checkpoint):
    _set_generation_eos(checkpoint, 5)
    assert eos_token_ids(str(checkpoint), SimpleNamespace(eos_token_id=0)) == (5, 0)


def test_without_generation_config_the_model_config_decides(checkpoint):
    (checkpoint / "generation_config.json").unlink()
    assert eos_token_ids(str(checkpoint), SimpleNamespace(eos_token_id=None)) == (0,)


def test_the_engine_stops_on_an_eos_id_listed_only_in_generation_config(
    checkpoint, tokenizer, prompt_ids, hf_greedy, make_engine
):
    expected = hf_greedy(prompt_ids[0], 20)
    _set_generation_eos(checkpoint, [0, expected[4]])
    config = load_config(overrides={"models": {"target": str(checkpoint)}, "speculation": {"proposer": "ngram"}})
    reference = make_engine("ngram", gamma=4).engine  # the bundled target: the same weights
    engine = build_engine(config, reference.verifier, reference.proposer, tokenizer).engine
    [r] = engine.generate([GenerationRequest(prompt_ids[0], 20)])
    assert (r.token_ids, r.finish_reason) == (expected[: expected.index(expected[4]) + 1], "stop")


class RecordingPolicy:
    """A round policy with a background part (like the LoadMonitor): started and stopped."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def plan(self, rows, default_gamma):
        return self.inner.plan(rows, default_gamma)

    def record(self, sample):
        self.inner.record(sample)

    def on_arrival(self, count=1):
        self.inner.on_arrival(count)

    def set_load(self, in_flight, queued):
        self.inner.set_load(in_flight, queued)

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")


def test_one_assembly_loads_the_registrys_proposers_and_runs_the_policy_with_the_engine(make_engine, tokenizer):
    from specdec.wiring.engine_builder import EngineParts, build_served_engine
    from specdec.policy.load_monitor import build_load_monitor

    config = load_config(overrides={"cache": {"num_slots": 2}})
    reference = make_engine("draft", gamma=4).engine  # the bundled pair: a verifier and a draft model
    draft = reference.proposer.proposers["draft"]
    no_draft = build_served_engine(config, EngineParts(reference.verifier, tokenizer=tokenizer))
    no_draft.close()
    assert no_draft.defaults.proposers == ("ngram",) and no_draft.monitor is None
    policy = RecordingPolicy(build_load_monitor(config.load_monitor, None, "test"))
    closed = []
    served = build_served_engine(config, EngineParts(reference.verifier, draft=lambda: draft, policy=policy,
                                                     tokenizer=tokenizer, closers=[lambda: closed.append(1)]))
    assert served.defaults.proposers == ("draft", "ngram") and served.monitor is policy and policy.calls == ["start"]
    assert served.model == config.models.target and served.tokenizer is tokenizer
    served.close()
    assert policy.calls == ["start", "stop"] and closed == [1]


def test_pipelined_rounds_measure_how_to_overlap_and_how_many_branches_to_draft():
    from specdec.wiring.engine_builder import build_draft_ahead

    ahead = build_draft_ahead()
    assert ahead.way is None and ahead.fixed_branches is None, "measured per kind of step, not configured"
    assert ahead.min_acceptance == 0.3 and ahead.branches == ahead.branch_hits.most
