"""EmulatedModel through the production ModelRunner: slots, prefill, rollback, forks, ragged
batches and tensor-parallel sharding behave as with a real model, and every forward charges
its device the profile's time for its rows, tokens and attended context."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.models.emulated_model import load_emulated_model
from specdec.models.emulated_profile import load_profile
from specdec.models.emulated_tokenizer import emulated_tokenizer, readable_ids
from specdec.models.loader import load_model
from specdec.models.model_runner import ModelRunner
from specdec.models.tensor_parallel import shard_model

TARGET = "emulated:h100-llama-8b-1b:target"
DRAFT = "emulated:h100-llama-8b-1b:draft"
HISTORY = [17, 300, 4, 4, 98, 256, 1, 77, 402, 9, 9, 130]


def make_runner(name: str = TARGET, time_scale: float = 0.0, slots: int = 4) -> ModelRunner:
    return ModelRunner(load_model(name, time_scale=time_scale), num_slots=slots, max_seq_len=64)


@pytest.mark.parametrize("name", [TARGET, DRAFT])
def test_logits_depend_on_the_history_not_on_how_it_was_fed(name):
    runner = make_runner(name)
    whole, stepped = runner.allocate_slot(), runner.allocate_slot()
    at_once = runner.forward([whole], [HISTORY])[0]  # [T, V]
    runner.forward([stepped], [HISTORY[:5]])
    one_by_one = [runner.forward([stepped], [[token]], last_only=True)[0] for token in HISTORY[5:]]
    assert torch.equal(at_once[5:], torch.stack(one_by_one))
    assert runner.slot_length(whole) == runner.slot_length(stepped) == len(HISTORY)


def test_a_targets_logits_are_its_languages_row_for_the_last_tokens_whichever_blocks_hold_them():
    """The cache is addressed through its block table: two slots fed in turns of 5 tokens hold
    interleaved blocks of 4, and every position's logits are still the row of its own text's
    last context_tokens tokens (worked out here from the text, not the cache)."""
    runner = ModelRunner(load_model(TARGET, time_scale=0.0), num_slots=2, max_seq_len=64, block_size=4)
    language, texts = runner.model.language, [HISTORY * 3, HISTORY[::-1] * 3]  # 36 tokens each
    slots = [runner.allocate_slot(), runner.allocate_slot()]
    logits: list[list[torch.Tensor]] = [[], []]
    for start in range(0, len(texts[0]), 5):
        for row in (0, 1):
            logits[row].append(runner.forward([slots[row]], [texts[row][start:start + 5]])[0])  # [≤5, V]
    n = language.spec.context_tokens
    for row, text in enumerate(texts):
        windows = np.array([[text[j] if j >= 0 else language.vocab_size for j in range(i - n + 1, i + 1)]
                            for i in range(len(text))])  # [T, n], oldest first
        expected = language.rows(language.buckets_of(language.context_keys(windows)))  # [T, V]
        assert torch.equal(torch.cat(logits[row]), expected)


def test_rolled_back_and_forked_slots_continue_like_the_original():
    runner = make_runner(DRAFT)
    slot = runner.allocate_slot()
    runner.forward([slot], [HISTORY])
    expected = runner.forward([slot], [[5, 6, 7]])  # [1, 3, V]
    runner.truncate(slot, len(HISTORY))  # reject the three
    assert torch.equal(runner.forward([slot], [[5, 6, 7]]), expected)
    fork = runner.fork_slot(slot, len(HISTORY))
    assert torch.equal(runner.forward([fork], [[5, 6, 7]]), expected)


def test_a_ragged_batch_equals_its_rows_alone():
    runner = make_runner(TARGET)
    a, b, c, d = (runner.allocate_slot() for _ in range(4))
    runner.forward([a, b], [HISTORY, HISTORY[:3]])
    batched = runner.forward([a, b], [[1, 2, 3], [8]])  # [2, 3, V], row b padded
    runner.forward([c], [HISTORY]), runner.forward([d], [HISTORY[:3]])
    assert torch.equal(batched[0], runner.forward([c], [[1, 2, 3]])[0])
    assert torch.equal(batched[1, 0], runner.forward([d], [[8]])[0, 0])


def test_a_forward_charges_the_profiles_time_for_rows_tokens_and_context():
    runner = make_runner(TARGET, time_scale=0.01)
    device = runner.model.emulated_device
    latency = load_profile("h100-llama-8b-1b").target.latency
    a, b = runner.allocate_slot(), runner.allocate_slot()
    runner.forward([a, b], [HISTORY, HISTORY[:10]])
    runner.forward([a, b], [[1, 2, 3], [8]])  # 4 tokens; attends 12 + 3 and 10 + 1 tokens
    expected = latency.forward_ms(2, 22, 22) + latency.forward_ms(2, 4, 15 + 11)
    assert device.forwards == 2
    assert device.busy_s == pytest.approx(expected / 1000 * 0.01)


def test_tensor_parallel_layout_checks_divisibility_and_keeps_full_logits():
    name = "emulated:4xh100-llama-70b-1b:target"
    full = make_runner(name)
    rank = ModelRunner(shard_model(load_model(name, time_scale=0.0), rank=2, world_size=4), num_slots=4, max_seq_len=64)
    assert (rank.model.tp_rank, rank.model.tp_world_size) == (2, 4)
    slots = full.allocate_slot(), rank.allocate_slot()
    assert torch.equal(full.forward([slots[0]], [HISTORY]), rank.forward([slots[1]], [HISTORY]))
    with pytest.raises(ValueError, match="num_attention_heads=64"):
        shard_model(load_model(name), rank=0, world_size=3)


def test_each_model_is_a_device_of_its_own():
    target, draft = load_emulated_model(TARGET), load_emulated_model(DRAFT)
    assert target.emulated_device is not draft.emulated_device
    assert target.vocab_size == draft.vocab_size == load_profile("h100-llama-8b-1b").language.vocab_size


def test_the_context_limit_is_the_profiles():
    model = load_model(TARGET)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ModelRunner(model, num_slots=1, max_seq_len=model.config.max_position_embeddings + 1)


def test_only_readable_tokens_are_likely():
    runner = make_runner(TARGET, slots=1)
    probs = runner.forward([runner.allocate_slot()], [HISTORY])[0].double().softmax(-1)  # [T, V]
    readable = list(readable_ids(runner.vocab_size))
    assert float(probs[:, readable].sum(-1).min()) > 1 - 1e-12
    tokenizer = emulated_tokenizer(runner.vocab_size)
    assert all(tokenizer.decode([i]).strip("\n\t ").isprintable() for i in readable)
    assert 0 not in readable and len(readable) > 300
