"""KVCache: slot allocation, O(1) rollback and K/V storage semantics."""

from __future__ import annotations

import pytest
import torch

from specdec.models.kv_cache import CacheFullError, InvalidSlotError, KVCache


def _cache(num_slots: int = 3, max_seq_len: int = 8) -> KVCache:
    return KVCache(num_layers=2, num_slots=num_slots, max_seq_len=max_seq_len, num_kv_heads=2, head_dim=4)


def test_tensors_are_per_layer_slots_plus_one_scratch_slot():
    cache = _cache()
    assert len(cache.keys) == len(cache.values) == 2
    assert cache.keys[0].shape == (3 + 1, 8, 2, 4)  # [num_slots + scratch, max_seq_len, kv_heads, head_dim]
    assert cache.scratch_slot == 3


def test_allocate_hands_out_lowest_free_slot_with_zero_length():
    cache = _cache()
    assert [cache.allocate() for _ in range(3)] == [0, 1, 2]
    assert cache.num_free == 0
    assert all(cache.length(s) == 0 for s in range(3))


def test_allocate_when_full_raises_cache_full_error():
    cache = _cache(num_slots=2)
    cache.allocate()
    cache.allocate()
    with pytest.raises(CacheFullError, match="all 2 slots"):
        cache.allocate()
    assert isinstance(CacheFullError(), RuntimeError)


def test_freed_slot_is_reused_and_starts_empty():
    cache = _cache()
    first, _ = cache.allocate(), cache.allocate()
    cache.advance(first, 5)
    cache.free(first)
    assert cache.num_free == 2
    assert cache.allocate() == first
    assert cache.length(first) == 0


def test_double_free_raises():
    cache = _cache()
    slot = cache.allocate()
    cache.free(slot)
    with pytest.raises(InvalidSlotError, match="slot 0 is not allocated"):
        cache.free(slot)


@pytest.mark.parametrize("slot", [-1, 3, 99])
def test_unknown_slot_raises_for_every_operation(slot):
    cache = _cache()
    for operation in (cache.free, cache.length, lambda s: cache.truncate(s, 0), lambda s: cache.advance(s, 1)):
        with pytest.raises(InvalidSlotError, match=f"slot {slot} is out of range"):
            operation(slot)


def test_scratch_slot_is_never_allocatable_or_addressable():
    cache = _cache(num_slots=1)
    assert cache.allocate() == 0
    with pytest.raises(CacheFullError):
        cache.allocate()
    with pytest.raises(InvalidSlotError):
        cache.length(cache.scratch_slot)


def test_advance_grows_length_up_to_max_seq_len_only():
    cache = _cache(max_seq_len=8)
    slot = cache.allocate()
    cache.advance(slot, 6)
    assert cache.length(slot) == 6
    with pytest.raises(ValueError, match="exceeds max_seq_len=8"):
        cache.advance(slot, 3)
    assert cache.length(slot) == 6


def test_truncate_rolls_back_to_any_earlier_length_without_touching_tensors():
    cache = _cache()
    slot = cache.allocate()
    cache.advance(slot, 7)
    before = cache.keys[0].clone()
    cache.truncate(slot, 3)
    assert cache.length(slot) == 3
    cache.truncate(slot, 3)  # same length is allowed
    cache.truncate(slot, 0)
    assert cache.length(slot) == 0
    assert torch.equal(cache.keys[0], before)


@pytest.mark.parametrize("new_length", [-1, 5])
def test_truncate_outside_zero_to_current_length_raises(new_length):
    cache = _cache()
    slot = cache.allocate()
    cache.advance(slot, 4)
    with pytest.raises(ValueError, match=f"new_length={new_length} must be in \\[0, 4\\]"):
        cache.truncate(slot, new_length)
    assert cache.length(slot) == 4


def test_write_then_gather_returns_each_slots_prefix():
    cache = _cache()
    a, b = cache.allocate(), cache.allocate()
    keys = torch.randn(2, 3, 2, 4)  # [batch, seq, kv_heads, head_dim]
    values = torch.randn(2, 3, 2, 4)
    slots = torch.tensor([[a] * 3, [b] * 3])
    positions = torch.tensor([[0, 1, 2], [2, 3, 4]])
    cache.write(1, slots, positions, keys, values)
    got_k, got_v = cache.gather(1, torch.tensor([b, a]), kv_len=5)
    assert got_k.shape == (2, 5, 2, 4)
    assert torch.equal(got_k[0, 2:5], keys[1]) and torch.equal(got_v[0, 2:5], values[1])
    assert torch.equal(got_k[1, 0:3], keys[0]) and torch.equal(got_v[1, 0:3], values[0])
    assert torch.count_nonzero(cache.keys[0]) == 0  # other layers untouched


@pytest.mark.parametrize("field", ["num_layers", "num_slots", "max_seq_len", "num_kv_heads", "head_dim"])
def test_non_positive_dimensions_are_rejected_by_name(field):
    kwargs = dict(num_layers=1, num_slots=1, max_seq_len=1, num_kv_heads=1, head_dim=2)
    kwargs[field] = 0
    with pytest.raises(ValueError, match=f"{field}=0"):
        KVCache(**kwargs)


def test_copy_prefix_forks_a_slot_that_then_grows_on_its_own():
    cache = _cache()
    source, fork = cache.allocate(), cache.allocate()
    keys = torch.randn(1, 5, 2, 4)
    cache.write(0, torch.full((1, 5), source), torch.arange(5)[None], keys, -keys)
    cache.advance(source, 5)
    cache.copy_prefix(source, fork, 3)
    assert cache.length(fork) == 3 and cache.length(source) == 5
    fork_keys, fork_values = cache.gather(0, torch.tensor([fork]), 3)
    assert torch.equal(fork_keys[0], keys[0, :3]) and torch.equal(fork_values[0], -keys[0, :3])
    cache.write(0, torch.full((1, 1), fork), torch.tensor([[3]]), torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))
    assert torch.equal(cache.gather(0, torch.tensor([source]), 5)[0][0], keys[0]), "the source is untouched"


def test_copy_prefix_refuses_a_length_past_the_source_or_a_free_target():
    cache = _cache()
    source, fork = cache.allocate(), cache.allocate()
    cache.advance(source, 2)
    with pytest.raises(ValueError, match="length=3"):
        cache.copy_prefix(source, fork, 3)
    cache.free(fork)
    with pytest.raises(InvalidSlotError):
        cache.copy_prefix(source, fork, 1)
