"""ModelRunner bookkeeping and request validation; checkpoint loading and config parsing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdec.models import (
    CacheFullError,
    CheckpointError,
    InvalidSlotError,
    LlamaFamilyConfig,
    ModelRunner,
    UnsupportedModelError,
    load_model,
)


@pytest.fixture
def runner(tiny_checkpoint) -> ModelRunner:
    return ModelRunner.from_pretrained(str(tiny_checkpoint("llama")), num_slots=2, max_seq_len=16)


# ------------------------------------------------------------------------ runner
def test_runner_exposes_vocab_and_length_limits(runner):
    assert runner.vocab_size == 256
    assert runner.max_seq_len == 16
    assert runner.max_position_embeddings == 128
    assert runner.num_free_slots == 2


def test_forward_grows_each_slot_by_its_own_token_count(runner):
    a, b = runner.allocate_slot(), runner.allocate_slot()
    logits = runner.forward([a, b], [[1, 2, 3], [4]])
    assert logits.shape == (2, 3, 256) and logits.dtype == torch.float32
    assert (runner.slot_length(a), runner.slot_length(b)) == (3, 1)
    runner.forward([b], [[5, 6]])
    assert (runner.slot_length(a), runner.slot_length(b)) == (3, 3)


def test_a_prompt_among_decode_rows_runs_apart_and_gives_what_each_row_gives_alone(tiny_checkpoint):
    """One 40-token row and three 1-token rows: split into two forwards (no padding to 40),
    with the logits and cache lengths each row gets when it runs alone."""
    path = str(tiny_checkpoint("llama"))
    batched, alone = (ModelRunner.from_pretrained(path, num_slots=4, max_seq_len=64) for _ in range(2))
    rows = [[3, 4, 5], [7] * 40, [9], [11, 12]]
    history = [[1, 2], [1], [1, 2, 3], [2]]
    slots = [batched.allocate_slot() for _ in rows]
    solo = [alone.allocate_slot() for _ in rows]
    for runner, ids in ((batched, slots), (alone, solo)):
        for slot, past in zip(ids, history):
            runner.forward([slot], [past])
    calls, inner = [], batched.model.forward_hidden
    batched.model.forward_hidden = lambda input_ids, *a: calls.append(tuple(input_ids.shape)) or inner(input_ids, *a)
    full = batched.forward(slots, rows)
    assert full.shape == (4, 40, 256)
    assert sorted(calls) == [(1, 40), (3, 3)]  # the prompt alone, the others padded to 3
    for i, (slot, row) in enumerate(zip(solo, rows)):
        own = alone.forward([slot], [row])[0]  # [len(row), vocab]
        assert torch.allclose(full[i, : len(row)], own, atol=1e-4)
        assert batched.slot_length(slots[i]) == alone.slot_length(slot) == len(history[i]) + len(row)
    more = [[5], [6] * 20, [7], [8]]
    last = batched.forward(slots, more, last_only=True)
    assert last.shape == (4, 256)
    for i, (slot, row) in enumerate(zip(solo, more)):
        assert torch.allclose(last[i], alone.forward([slot], [row], last_only=True)[0], atol=1e-4)


def test_slots_are_allocated_freed_and_exhausted(runner):
    a, b = runner.allocate_slot(), runner.allocate_slot()
    assert runner.num_free_slots == 0
    with pytest.raises(CacheFullError):
        runner.allocate_slot()
    runner.free_slot(a)
    assert runner.num_free_slots == 1
    with pytest.raises(InvalidSlotError):
        runner.free_slot(a)
    runner.forward([b], [[1]])


def test_a_forked_slot_continues_exactly_like_its_source(runner):
    """fork_slot(slot, n): a new slot with the first n tokens; both then grow apart."""
    source = runner.allocate_slot()
    runner.forward([source], [[1, 2, 3, 4]])
    fork = runner.fork_slot(source, 3)
    assert runner.slot_length(fork) == 3 and runner.num_free_slots == 0
    forked = runner.forward([fork], [[9]], last_only=True)
    runner.truncate(source, 3)
    direct = runner.forward([source], [[9]], last_only=True)
    assert torch.allclose(forked, direct, atol=1e-6)
    with pytest.raises(CacheFullError):  # a fork needs a free slot
        runner.fork_slot(source, 2)
    runner.free_slot(fork)
    assert runner.num_free_slots == 1


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_block_size_changes_where_kv_lives_never_the_logits(tiny_checkpoint, family):
    """Ragged batches, a fork written past its shared prefix (copy-on-write) and a rollback give the
    same logits with 1-token blocks (every position in its own block) as with one block per sequence."""
    path = str(tiny_checkpoint(family))
    results = []
    for block_size in (1, 3, 64):
        runner = ModelRunner.from_pretrained(path, num_slots=3, max_seq_len=64, block_size=block_size)
        a, b = runner.allocate_slot(), runner.allocate_slot()
        out = [runner.forward([a, b], [[1, 2, 3, 4, 5], [6, 7]])]
        fork = runner.fork_slot(a, 4)
        out.append(runner.forward([fork, a, b], [[9, 10], [11], [12, 13, 14]]))
        runner.truncate(a, 2)
        out.append(runner.forward([a, fork], [[15, 16, 17], [18]]))
        results.append(out)
    for other in results[1:]:
        for expected, got in zip(results[0], other):
            assert torch.allclose(expected, got, atol=1e-5)


def test_a_memory_budget_of_blocks_admits_sequences_by_their_reserve(tiny_checkpoint):
    """num_blocks sizes the cache; short reserves let more sequences run than max_seq_len sizing would."""
    runner = ModelRunner.from_pretrained(str(tiny_checkpoint("llama")), num_slots=8, max_seq_len=64,
                                         block_size=16, num_blocks=8)  # room for 2 sequences of 64 tokens
    assert runner.num_free_slots == 2
    slots = [runner.allocate_slot(reserve_tokens=16) for _ in range(8)]
    assert runner.num_free_slots == 0
    runner.forward(slots, [[1] * 16] * 8)
    with pytest.raises(CacheFullError):
        runner.allocate_slot(reserve_tokens=1)


def test_a_memory_budget_in_bytes_or_as_a_fraction_sizes_the_block_pool(tiny_checkpoint):
    path = str(tiny_checkpoint("llama"))
    probe = ModelRunner.from_pretrained(path, num_slots=4, max_seq_len=32, block_size=8)
    block_bytes = probe.cache.block_bytes(probe.cache.num_layers, 8, probe.cache.num_kv_heads,
                                          probe.cache.head_dim, torch.float32)
    assert probe.cache.num_blocks == 4 * 4, "no budget: num_slots sequences of max_seq_len"
    sized = ModelRunner.from_pretrained(path, num_slots=4, max_seq_len=32, block_size=8,
                                        memory_budget=6.5 * block_bytes)
    assert sized.cache.num_blocks == 6
    capped = ModelRunner.from_pretrained(path, num_slots=4, max_seq_len=32, block_size=8, memory_budget=0.5)
    assert capped.cache.num_blocks == 16, "a budget never keeps more than num_slots x max_seq_len"
    with pytest.raises(ValueError, match="memory_budget=.* holds 3 blocks .* max_seq_len=32 needs 4"):
        ModelRunner.from_pretrained(path, num_slots=4, max_seq_len=32, block_size=8, memory_budget=3 * block_bytes)


def test_truncate_rolls_back_slot_length(runner):
    slot = runner.allocate_slot()
    runner.forward([slot], [[1, 2, 3, 4]])
    runner.truncate(slot, 1)
    assert runner.slot_length(slot) == 1
    with pytest.raises(ValueError, match="new_length=2"):
        runner.truncate(slot, 2)


def test_forward_past_max_seq_len_raises_naming_slot_and_lengths_and_changes_nothing(runner):
    a, b = runner.allocate_slot(), runner.allocate_slot()
    runner.forward([a], [[1] * 10])
    with pytest.raises(ValueError, match=f"slot {a}: length 10 \\+ 7 new tokens exceeds max_seq_len=16"):
        runner.forward([b, a], [[1], [2] * 7])
    assert (runner.slot_length(a), runner.slot_length(b)) == (10, 0)
    runner.forward([a], [[2] * 6])  # exactly fills the slot
    assert runner.slot_length(a) == 16


def test_empty_token_list_raises(runner):
    slot = runner.allocate_slot()
    with pytest.raises(ValueError, match=f"token_ids for slot {slot} is empty"):
        runner.forward([slot], [[]])


def test_empty_or_mismatched_batch_raises(runner):
    slot = runner.allocate_slot()
    with pytest.raises(ValueError, match="non-empty and equal in length"):
        runner.forward([], [])
    with pytest.raises(ValueError, match="non-empty and equal in length"):
        runner.forward([slot], [[1], [2]])


def test_duplicated_slot_ids_raise(runner):
    slot = runner.allocate_slot()
    with pytest.raises(ValueError, match="duplicated slot ids"):
        runner.forward([slot, slot], [[1], [2]])


@pytest.mark.parametrize("slot", [1, 7, -1])
def test_unallocated_or_unknown_slot_raises(runner, slot):
    runner.allocate_slot()  # slot 0 only
    with pytest.raises(InvalidSlotError, match=f"slot {slot} is"):
        runner.forward([slot], [[1]])


def test_token_ids_outside_vocab_raise(runner):
    slot = runner.allocate_slot()
    with pytest.raises(ValueError, match="outside \\[0, vocab_size=256\\)"):
        runner.forward([slot], [[256]])


def test_max_seq_len_beyond_max_position_embeddings_raises(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint("llama")))
    with pytest.raises(ValueError, match="max_seq_len=129"):
        ModelRunner(model, num_slots=1, max_seq_len=129)


def test_bfloat16_load_casts_weights_and_still_returns_float32_logits(tiny_checkpoint):
    runner = ModelRunner.from_pretrained(str(tiny_checkpoint("qwen2")), num_slots=1, max_seq_len=8, dtype="bf16")
    assert all(p.dtype == torch.bfloat16 for p in runner.model.parameters())
    assert runner.cache.keys[0].dtype == torch.bfloat16
    slot = runner.allocate_slot()
    assert runner.forward([slot], [[1, 2]], last_only=True).dtype == torch.float32


# ------------------------------------------------------------------------ loader
def test_tied_checkpoint_shares_embedding_and_lm_head(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint("llama3_rope_tied")))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_sharded_checkpoint_loads_the_same_weights(tiny_checkpoint):
    sharded = tiny_checkpoint("llama", shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    a, b = load_model(str(sharded)), load_model(str(tiny_checkpoint("llama")))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def test_hub_id_is_resolved_with_snapshot_download(tiny_checkpoint, monkeypatch):
    import huggingface_hub

    requested = []

    def fake_snapshot_download(repo_id: str, **kwargs) -> str:
        requested.append(repo_id)
        return str(tiny_checkpoint("llama"))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    runner = ModelRunner.from_pretrained("some-org/tiny-llama", num_slots=1, max_seq_len=8)
    assert requested == ["some-org/tiny-llama"] and runner.vocab_size == 256


def test_missing_directory_config_or_weights_raise_file_not_found(tiny_checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(str(tmp_path))
    shutil.copy(tiny_checkpoint("llama") / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_model(str(tmp_path))


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


def test_unsupported_model_type_raises(tiny_checkpoint, tmp_path):
    path = _copy_with_config(tiny_checkpoint("llama"), tmp_path / "ck", model_type="gpt2")
    with pytest.raises(UnsupportedModelError, match="model_type='gpt2'"):
        load_model(path)


def test_weights_not_matching_config_raise_checkpoint_error(tiny_checkpoint, tmp_path):
    path = _copy_with_config(tiny_checkpoint("llama"), tmp_path / "ck", model_type="qwen2")  # expects q/k/v biases
    with pytest.raises(CheckpointError, match="missing=.*q_proj.bias"):
        load_model(path)


def test_unknown_dtype_raises(tiny_checkpoint):
    with pytest.raises(ValueError, match="dtype='int8'"):
        load_model(str(tiny_checkpoint("llama")), dtype="int8")


# ------------------------------------------------------------------------ config
def _raw(**changes) -> dict:
    raw = dict(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64)
    raw.update(changes)
    return raw


def test_config_defaults_kv_heads_and_head_dim():
    config = LlamaFamilyConfig.from_dict(_raw())
    assert (config.num_key_value_heads, config.head_dim) == (4, 4)
    assert (config.rope.rope_type, config.rope.theta) == ("default", 10000.0)


def test_legacy_rope_theta_and_rope_scaling_are_understood():
    scaling = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    config = LlamaFamilyConfig.from_dict(_raw(rope_theta=500000.0, rope_scaling=scaling))
    assert (config.rope.rope_type, config.rope.theta, config.rope.scaling["factor"]) == ("llama3", 500000.0, 8.0)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type='yarn'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "requires \\['factor'"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"vocab_size": None}, "'vocab_size'"),
        ({"model_type": "mistral", "sliding_window": 0}, "sliding_window=0"),
    ],
)
def test_unsupported_config_features_raise_naming_the_field(changes, message):
    with pytest.raises(UnsupportedModelError, match=message):
        LlamaFamilyConfig.from_dict(_raw(**changes))


def test_sliding_windows_follow_each_family():
    assert LlamaFamilyConfig.from_dict(_raw(model_type="mistral", sliding_window=None)).sliding_windows == (None, None)
    assert LlamaFamilyConfig.from_dict(_raw(model_type="mistral", sliding_window=8)).sliding_windows == (8, 8)
    qwen = _raw(model_type="qwen2", sliding_window=8, max_window_layers=1)
    assert LlamaFamilyConfig.from_dict(qwen).sliding_windows == (None, None)  # use_sliding_window is off
    assert LlamaFamilyConfig.from_dict({**qwen, "use_sliding_window": True}).sliding_windows == (None, 8)
