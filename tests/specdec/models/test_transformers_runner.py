"""The transformers fallback runner keeps ModelRunner's contract: slots, rollback, forks and request
validation; the runner choice follows the checkpoint's model_type and the configured preference."""

from __future__ import annotations

import logging

import pytest
import torch

from specdec.models import CacheFullError, InvalidSlotError, UnsupportedModelError
from specdec.models.runners import choose_runner, config_vocab_size, open_runner
from specdec.models.transformers_runner import TransformersRunner


@pytest.fixture
def runner(tiny_checkpoint) -> TransformersRunner:
    return open_runner(str(tiny_checkpoint("gpt2")), num_slots=2, max_seq_len=16)


def test_unknown_model_type_gets_the_fallback_and_start_up_says_so(tiny_checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="specdec.models.runners"):
        runner = open_runner(str(tiny_checkpoint("gpt2")), num_slots=2, max_seq_len=16)
    assert isinstance(runner, TransformersRunner) and runner.runner_kind == "transformers"
    assert "model_type=gpt2): transformers runner (the own runtime cannot serve it" in caplog.text
    [choice] = [r for r in caplog.records if r.name == "specdec.models.runners"]
    assert choice.levelno == logging.WARNING  # slower: shown at the CLI's default log level
    assert "not paged: each of its 2 slots may grow to max_seq_len=16 as tokens arrive, admission counts slots" in (
        choice.getMessage())
    with caplog.at_level(logging.INFO, logger="specdec.models.runners"):
        own = open_runner(str(tiny_checkpoint("qwen3")), num_slots=2, max_seq_len=16)
    assert own.runner_kind == "specdec"
    assert "model_type=qwen3): specdec runner (the own runtime implements it)" in caplog.text


def test_choice_can_force_either_runner(tiny_checkpoint):
    assert choose_runner(tiny_checkpoint("qwen3"), "transformers") == ("transformers", "configured")
    assert choose_runner(tiny_checkpoint("qwen3"), "specdec") == ("specdec", "configured")
    with pytest.raises(UnsupportedModelError, match="model_type='gpt2'"):
        choose_runner(tiny_checkpoint("gpt2"), "specdec")
    assert config_vocab_size(tiny_checkpoint("gpt2")) == 256


def test_slots_are_allocated_exhausted_and_freed(runner):
    a, b = runner.allocate_slot(), runner.allocate_slot()
    assert (a, b, runner.num_free_slots, runner.cache.num_slots) == (0, 1, 0, 2)
    with pytest.raises(CacheFullError):
        runner.allocate_slot()
    runner.free_slot(a)
    with pytest.raises(InvalidSlotError):
        runner.free_slot(a)
    with pytest.raises(InvalidSlotError):
        runner.slot_length(a)
    assert runner.allocate_slot() == a and runner.slot_length(a) == 0


def test_a_fork_continues_like_its_source_prefix_and_leaves_the_source_alone(runner):
    source = runner.allocate_slot()
    runner.forward([source], [[3, 4, 5, 6, 7]])
    fork = runner.fork_slot(source, 3)
    assert (runner.slot_length(source), runner.slot_length(fork)) == (5, 3)
    forked = runner.forward([fork], [[9, 10]])[0]  # [2, V]
    runner.truncate(source, 3)
    assert torch.allclose(runner.forward([source], [[9, 10]])[0], forked, atol=1e-5)


def test_ragged_rows_and_last_only_shapes(runner):
    a, b = runner.allocate_slot(), runner.allocate_slot()
    full = runner.forward([a, b], [[1, 2, 3], [4]])
    assert full.shape == (2, 3, 256) and full.dtype == torch.float32
    assert (runner.slot_length(a), runner.slot_length(b)) == (3, 1)
    last = runner.forward([a, b], [[5], [6, 7]], last_only=True)
    assert last.shape == (2, 256)


@pytest.mark.parametrize(
    "slots, rows, message",
    [
        ([0, 0], [[1], [2]], "duplicated slot ids"),
        ([0], [[]], "is empty"),
        ([0], [[256]], "outside \\[0, vocab_size=256\\)"),
        ([0], [[1] * 17], "exceeds max_seq_len=16"),
    ],
)
def test_bad_forwards_are_refused_before_running(runner, slots, rows, message):
    runner.allocate_slot()
    with pytest.raises(ValueError, match=message):
        runner.forward(slots, rows)
    assert runner.slot_length(0) == 0


def test_the_fallback_admits_by_slots_whatever_the_reserve_and_caches_no_prefix(tiny_checkpoint):
    runner = open_runner(str(tiny_checkpoint("gpt2")), num_slots=2, max_seq_len=16)
    assert runner.admits([4, 4, 4]) == 2 and runner.block_capacity == (0, 0)
    slot = runner.allocate_slot(reserve_tokens=4)
    runner.forward([slot], [[1, 2, 3]], last_only=True)
    assert runner.cached_tokens(slot) == 0 and runner.admits([16, 16]) == 1


def test_with_a_budget_the_fallback_admits_on_reserves_as_its_caches_grow(tiny_checkpoint):
    runner = open_runner(str(tiny_checkpoint("gpt2")), num_slots=8, max_seq_len=None, kv_tokens=40)
    assert runner.max_seq_len == 40 and runner.block_capacity == (40, 1), "the context, at most the budget"
    runner = open_runner(str(tiny_checkpoint("gpt2")), num_slots=8, max_seq_len=16, kv_tokens=40)
    assert runner.admits([8, 8, 8, 8, 8, 8]) == 5 and runner.num_free_slots == 2
    first = runner.allocate_slot(reserve_tokens=16)
    assert runner.cache_usage == 16 / 40 and runner.admits([16, 16]) == 1
    runner.fork_slot(first, 0)  # a fork reserves what its source may grow to
    with pytest.raises(CacheFullError):
        runner.allocate_slot(reserve_tokens=16)


def test_with_a_budget_the_fallback_grows_reserves_while_the_budget_covers_them(tiny_checkpoint):
    """The engine's grants work here too: admitted on its next round's need, a slot's reserve
    grows as it decodes, in order, while the budget's unreserved tokens (after sequences not
    allocated yet) cover the increase."""
    runner = open_runner(str(tiny_checkpoint("gpt2")), num_slots=8, max_seq_len=16, kv_tokens=40)
    first, second = runner.allocate_slot(reserve_tokens=8), runner.allocate_slot(reserve_tokens=8)
    assert runner.grow_reserves([(first, 16), (second, 16)], taken=[16]) == 1, "16 + 8 + 16 taken: 8 left"
    assert runner.cache_usage == 24 / 40 and runner.admits([16, 1]) == 1
    assert runner.grow_reserves([(second, 4), (first, 30)]) == 2, "never shrinks; at most max_seq_len"
    assert runner.cache.reserves == {first: 16, second: 8}
