"""Slot-organised key/value cache for serving.

Each sequence owns one *slot*: a contiguous ``[max_seq_len, num_kv_heads, head_dim]``
region in every layer's K and V tensor. A slot's length is bookkeeping only, so rolling
back rejected draft tokens is O(1): the stale entries are simply overwritten later.

One extra, never-allocated *scratch* slot (index ``num_slots``) receives the K/V of
padding tokens in ragged batches, so padding never touches a real sequence.
"""

from __future__ import annotations

import heapq
import operator

import torch


class CacheFullError(RuntimeError):
    """Every slot of the cache is in use."""


class InvalidSlotError(ValueError):
    """A slot id that is out of range or not currently allocated."""


def _as_index(slot: object) -> int | None:
    """``slot`` as a Python int (accepts numpy / torch integer scalars), or None if it is not an integer."""
    if isinstance(slot, bool):
        return None
    try:
        return operator.index(slot)
    except TypeError:
        return None


class KVCache:
    """Per-layer K/V tensors ``[num_slots + 1, max_seq_len, num_kv_heads, head_dim]`` plus slot lengths."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots), ("max_seq_len", max_seq_len),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scratch_slot = num_slots
        shape = (num_slots + 1, max_seq_len, num_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._lengths = [0] * num_slots
        self._allocated = [False] * num_slots
        self._free_heap = list(range(num_slots))  # lowest free slot is handed out first

    # ----------------------------------------------------------------- bookkeeping
    @property
    def num_free(self) -> int:
        """Number of slots that can still be allocated."""
        return len(self._free_heap)

    def allocate(self) -> int:
        """Reserve an empty slot and return its id; raise CacheFullError if none is free."""
        if not self._free_heap:
            raise CacheFullError(f"KV cache is full: all {self.num_slots} slots are allocated")
        slot = heapq.heappop(self._free_heap)
        self._allocated[slot] = True
        self._lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        """Release ``slot``; raise InvalidSlotError if it is unknown or already free."""
        self._check_allocated(slot)
        slot = operator.index(slot)
        self._allocated[slot] = False
        self._lengths[slot] = 0
        heapq.heappush(self._free_heap, slot)

    def is_allocated(self, slot: int) -> bool:
        """True when ``slot`` is a valid id that is currently allocated."""
        index = _as_index(slot)
        return index is not None and 0 <= index < self.num_slots and self._allocated[index]

    def length(self, slot: int) -> int:
        """Number of cached tokens in ``slot``."""
        self._check_allocated(slot)
        return self._lengths[slot]

    def truncate(self, slot: int, new_length: int) -> None:
        """Roll ``slot`` back to ``new_length`` tokens (O(1)); 0 <= new_length <= current length."""
        current = self.length(slot)
        if not 0 <= new_length <= current:
            raise ValueError(f"truncate slot {slot}: new_length={new_length} must be in [0, {current}]")
        self._lengths[slot] = new_length

    def advance(self, slot: int, num_tokens: int) -> None:
        """Record that ``num_tokens`` tokens were written after the current end of ``slot``."""
        current = self.length(slot)
        if num_tokens < 0 or current + num_tokens > self.max_seq_len:
            raise ValueError(
                f"advance slot {slot}: length {current} + num_tokens {num_tokens} "
                f"exceeds max_seq_len={self.max_seq_len}"
            )
        self._lengths[slot] = current + num_tokens

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Make ``target`` hold the first ``length`` tokens of ``source`` (a fork: the two then
        grow independently); 0 <= length <= length of source."""
        if not 0 <= length <= self.length(source):
            raise ValueError(f"copy_prefix: length={length} must be in [0, {self.length(source)}]")
        self._check_allocated(target)
        for keys, values in zip(self.keys, self.values):
            keys[target, :length] = keys[source, :length]
            values[target, :length] = values[source, :length]
        self._lengths[target] = length

    def _check_allocated(self, slot: int) -> None:
        if not self.is_allocated(slot):
            index = _as_index(slot)
            in_range = index is not None and 0 <= index < self.num_slots
            state = "not allocated" if in_range else "out of range"
            raise InvalidSlotError(f"slot {slot!r} is {state} (num_slots={self.num_slots})")

    # ----------------------------------------------------------------- tensor access
    def write(
        self,
        layer: int,
        write_slots: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> None:
        """Store K/V of new tokens: token (b, t) goes to slot ``write_slots[b, t]`` at ``positions[b, t]``.

        write_slots, positions: [batch, seq] (int64); keys, values: [batch, seq, num_kv_heads, head_dim].
        """
        assert write_slots.shape == positions.shape == keys.shape[:2], (
            f"write_slots {tuple(write_slots.shape)}, positions {tuple(positions.shape)}, keys {tuple(keys.shape)}"
        )
        assert keys.shape == values.shape and keys.shape[2:] == (self.num_kv_heads, self.head_dim)
        self.keys[layer][write_slots, positions] = keys
        self.values[layer][write_slots, positions] = values

    def gather(self, layer: int, slot_ids: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the first ``kv_len`` cached K and V of each slot, each [batch, kv_len, num_kv_heads, head_dim]."""
        assert slot_ids.dim() == 1, f"slot_ids must be [batch], got {tuple(slot_ids.shape)}"
        assert 1 <= kv_len <= self.max_seq_len, f"kv_len={kv_len} out of [1, {self.max_seq_len}]"
        keys = self.keys[layer][:, :kv_len].index_select(0, slot_ids)
        values = self.values[layer][:, :kv_len].index_select(0, slot_ids)
        return keys, values
