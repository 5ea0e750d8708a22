"""DecodeSteps: a proposal's one-token forwards with inputs built once give what plain forwards give."""

from __future__ import annotations

import pytest
import torch

from specdec.models import ModelRunner
from specdec.models.decode_steps import ForwardSteps, decode_steps


@pytest.fixture
def pair(tiny_checkpoint) -> tuple[ModelRunner, ModelRunner]:
    """Two runners on the same weights (small blocks, so the steps cross block boundaries)."""
    path = str(tiny_checkpoint("llama"))
    return tuple(ModelRunner.from_pretrained(path, num_slots=4, max_seq_len=48, block_size=4) for _ in range(2))


def _prefill(runner: ModelRunner, prompts: list[list[int]]) -> list[int]:
    slots = [runner.allocate_slot() for _ in prompts]
    runner.forward(slots, prompts, last_only=True)
    return slots


def test_steps_give_the_logits_and_cache_of_plain_forwards(pair):
    """Rows of different lengths step together, then one drops out (its count spent)."""
    stepped, plain = pair
    prompts, counts = [[3, 4, 5, 6, 7], [9, 8, 7]], [4, 2]
    slots, plain_slots = _prefill(stepped, prompts), _prefill(plain, prompts)
    steps = stepped.decode_steps(slots, counts)
    for tokens, rows in (([11, 12], None), ([13, 14], [0, 1]), ([15], [0]), ([16], [0])):
        got = steps.forward(tokens, rows)
        want = plain.forward([plain_slots[b] for b in rows or (0, 1)], [[t] for t in tokens], last_only=True)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert torch.allclose(got, want, atol=1e-5)
    assert [stepped.slot_length(s) for s in slots] == [9, 5]
    again, direct = stepped.forward(slots, [[20], [21]], last_only=True), plain.forward(plain_slots, [[20], [21]],
                                                                                          last_only=True)
    assert torch.allclose(again, direct, atol=1e-5)  # the cache holds what plain forwards wrote


def test_a_fork_stepped_leaves_its_source_unchanged(pair):
    """Every step's blocks are made writable up front: a block shared with a fork is copied first."""
    runner, _ = pair
    (source,) = _prefill(runner, [[1, 2, 3, 4, 5, 6]])
    before = runner.forward([source], [[7]], last_only=True)
    runner.truncate(source, 6)
    fork = runner.fork_slot(source, 6)
    steps = runner.decode_steps([fork], [3])
    for token in (30, 31, 32):
        steps.forward([token])
    assert runner.slot_length(fork) == 9 and runner.slot_length(source) == 6
    assert torch.allclose(runner.forward([source], [[7]], last_only=True), before, atol=1e-6)


def test_a_row_past_its_count_or_a_token_outside_the_vocabulary_raises_and_changes_nothing(pair):
    runner, _ = pair
    slots = _prefill(runner, [[1, 2], [3, 4]])
    steps = runner.decode_steps(slots, [1, 0])
    with pytest.raises(ValueError, match="past its count"):
        steps.forward([5, 6])  # row 1 may take no step
    with pytest.raises(ValueError, match="vocab"):
        steps.forward([runner.vocab_size], [0])
    assert [runner.slot_length(s) for s in slots] == [2, 2]
    steps.forward([5], [0])
    with pytest.raises(ValueError, match="past its count"):
        steps.forward([6], [0])
    assert [runner.slot_length(s) for s in slots] == [3, 2]


def test_steps_that_do_not_fit_the_context_or_name_a_free_slot_raise(pair):
    runner, _ = pair
    (slot,) = _prefill(runner, [[1] * 40])
    with pytest.raises(ValueError, match="max_seq_len"):
        runner.decode_steps([slot], [9])
    with pytest.raises(ValueError, match="distinct"):
        runner.decode_steps([slot, slot], [1, 1])
    runner.free_slot(slot)
    with pytest.raises(ValueError):  # InvalidSlotError
        runner.decode_steps([slot], [1])


def test_a_runner_without_decode_steps_gets_plain_forwards(pair):
    stepped, plain = pair
    slots, plain_slots = _prefill(stepped, [[1, 2, 3]]), _prefill(plain, [[1, 2, 3]])

    class Bare:  # the runner API without decode_steps (the transformers fallback's)
        forward = plain.forward

    steps = decode_steps(Bare(), plain_slots, [2])
    assert isinstance(steps, ForwardSteps)
    assert torch.allclose(steps.forward([5]), stepped.decode_steps(slots, [2]).forward([5]), atol=1e-5)
