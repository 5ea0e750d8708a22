"""One assembly of the engine from config; it stops where transformers' generate() stops."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from specdec.config import load_config
from specdec.engine_builder import eos_token_ids
from specdec.engine_builder import make_engine as assemble
from specdec.model_paths import resolve_model_path
from specdec.request import GenerationRequest


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
    engine = assemble(config, reference.verifier, reference.proposer, tokenizer)
    [r] = engine.generate([GenerationRequest(prompt_ids[0], 20)])
    assert (r.token_ids, r.finish_reason) == (expected[: expected.index(expected[4]) + 1], "stop")
