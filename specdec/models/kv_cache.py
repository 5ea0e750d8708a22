"""Paged key/value cache for serving: which blocks each sequence reads, and its length.

K/V live in per-layer pools of fixed-size blocks (`BlockStorage`); each sequence (a *slot* id, as
the engine knows it) has a block table mapping its positions to blocks, so memory is taken as a
sequence grows (`prepare`) and returned when it ends (`free`), not reserved for ``max_seq_len`` up
front.

* Rollback (`truncate`) is length bookkeeping plus the eager release of whole blocks past the
  new length: O(blocks dropped), one or two for a rejected draft.
* A fork (`fork`) lists its source's prefix blocks in its own table (reference counts, no copy);
  a write into a block another table still references copies that block first (copy-on-write),
  so a fork never changes what its source reads, nor the reverse.
* Prefix caching: a full block is indexed by its tokens and all before them (`PrefixIndex`);
  `attach_prefix` lists the indexed blocks a new prompt starts with in its table, so only the
  rest is computed. Unreferenced indexed blocks stay readable until evicted (LRU, `BlockPool`).
* Admission in blocks: each live sequence may grow to its *reserve*, and `num_free`, `admits` and
  `grow` count only the blocks not owed to live ones (`CacheAdmission`).
"""

from __future__ import annotations

import heapq
import operator

import torch

from specdec.models.block_pool import BlockPool, CacheFullError
from specdec.models.block_storage import BlockStorage
from specdec.models.cache_admission import CacheAdmission
from specdec.models.pool_sizing import blocks_for as _blocks_for
from specdec.models.prefix_index import ROOT, PrefixIndex, block_key

__all__ = ["CacheFullError", "InvalidSlotError", "KVCache", "DEFAULT_BLOCK_SIZE"]

DEFAULT_BLOCK_SIZE = 16  # tokens per block


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


class KVCache(BlockStorage, CacheAdmission):
    """Block tables and lengths per slot over the block tensors (see the module docstring)."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_blocks: int | None = None,
        prefix_caching: bool = True,
    ) -> None:
        super().__init__(num_layers, num_slots, max_seq_len, num_kv_heads, head_dim, dtype, device, block_size,
                         num_blocks)
        self.pool = BlockPool(self.scratch_block)  # blocks 0 … num_blocks - 1: all but the scratch block
        self.prefix = PrefixIndex(self.pool) if prefix_caching else None
        self._tables: list[list[int]] = [[] for _ in range(num_slots)]  # mirrored in block_table
        self._lengths = [0] * num_slots
        self._reserve = [0] * num_slots  # blocks each live slot may grow to
        self._allocated = [False] * num_slots
        self._live: set[int] = set()  # allocated slots: what admission walks, whatever num_slots is
        self._tokens: list[list[int] | None] = [None] * num_slots  # token ids, while every write came with them
        self._keys: list[list[bytes]] = [[] for _ in range(num_slots)]  # prefix key of each full block
        self._cached_tokens = [0] * num_slots  # tokens taken from the prefix cache
        self._free_heap = list(range(num_slots))  # lowest free slot is handed out first

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def allocate(self, reserve_tokens: int | None = None) -> int:
        """Reserve an empty slot that may grow to ``reserve_tokens`` (None or 0: ``max_seq_len``) and
        return its id; CacheFullError when no slot or not enough unowed blocks are free."""
        reserve = self._reserve_blocks(reserve_tokens)
        if not self._free_heap:
            raise CacheFullError(f"KV cache is full: all {self.num_slots} slots are allocated")
        if reserve > self._headroom():
            raise CacheFullError(f"KV cache is full: {reserve} blocks needed, {self._headroom()} of "
                                 f"{self.num_blocks} not owed to running sequences")
        slot = heapq.heappop(self._free_heap)
        self._allocated[slot], self._lengths[slot], self._reserve[slot] = True, 0, reserve
        self._live.add(slot)
        self._tokens[slot], self._keys[slot], self._cached_tokens[slot] = [], [], 0
        return slot

    def free(self, slot: int) -> None:
        """Release ``slot`` and its blocks; raise InvalidSlotError if it is unknown or already free."""
        self._check_allocated(slot)
        slot = operator.index(slot)
        self._drop_blocks(slot, 0)
        self._allocated[slot], self._lengths[slot], self._reserve[slot] = False, 0, 0
        self._live.discard(slot)
        self._tokens[slot], self._keys[slot] = None, []
        heapq.heappush(self._free_heap, slot)

    def is_allocated(self, slot: int) -> bool:
        """True when ``slot`` is a valid id that is currently allocated."""
        index = _as_index(slot)
        return index is not None and 0 <= index < self.num_slots and self._allocated[index]

    def length(self, slot: int) -> int:
        """Number of cached tokens in ``slot``."""
        self._check_allocated(slot)
        return self._lengths[slot]

    def lengths(self, slots: list[int]) -> list[int]:
        """Each slot's `length`, checked once per slot (InvalidSlotError for one not allocated)."""
        allocated, lengths, num_slots = self._allocated, self._lengths, self.num_slots
        for slot in slots:
            if not (type(slot) is int and 0 <= slot < num_slots and allocated[slot]):
                self._check_allocated(slot)
        return [lengths[slot] for slot in slots]

    def blocks(self, slot: int) -> list[int]:
        """The block ids of ``slot``'s table, in position order."""
        self._check_allocated(slot)
        return list(self._tables[slot])

    def truncate(self, slot: int, new_length: int) -> None:
        """Roll ``slot`` back to ``new_length`` tokens; 0 <= new_length <= current length. Whole blocks
        past the new length are released now (eagerly), so a fork's shared tail is never kept alive."""
        current = self.length(slot)
        if not 0 <= new_length <= current:
            raise ValueError(f"truncate slot {slot}: new_length={new_length} must be in [0, {current}]")
        self._lengths[slot] = new_length
        self._drop_blocks(slot, _blocks_for(new_length, self.block_size))
        if self._tokens[slot] is not None:
            del self._tokens[slot][new_length:]
        del self._keys[slot][new_length // self.block_size:]

    def advance(self, slot: int, num_tokens: int, token_ids: list[int] | None = None) -> None:
        """Record that ``num_tokens`` tokens were written after the current end of ``slot`` (its
        positions `prepare`d first, as a forward does: only a slot whose table falls short gets its
        blocks here); with their ``token_ids`` the blocks they fill join the prefix cache (without,
        the slot stops feeding it)."""
        current = self.length(slot)
        if num_tokens < 0 or current + num_tokens > self.max_seq_len:
            raise ValueError(
                f"advance slot {slot}: length {current} + num_tokens {num_tokens} "
                f"exceeds max_seq_len={self.max_seq_len}"
            )
        if len(self._tables[slot]) < _blocks_for(current + num_tokens, self.block_size):
            self.prepare(slot, num_tokens)
        if token_ids is not None:
            assert len(token_ids) == num_tokens, f"{len(token_ids)} token ids for {num_tokens} tokens"
        self._advance_row(slot, num_tokens, token_ids)

    def advance_rows(self, slots: list[int], token_ids: list[list[int]]) -> None:
        """`advance` for a forward's rows at once: ``token_ids[b]`` were written after slot
        ``slots[b]``'s end, into positions `prepare_rows` made writable (the forward checked the
        slots and their room, `check_forward_request`)."""
        for slot, row in zip(slots, token_ids):
            self._advance_row(slot, len(row), row)

    def _advance_row(self, slot: int, num_tokens: int, token_ids: list[int] | None) -> None:
        length = self._lengths[slot] = self._lengths[slot] + num_tokens
        tokens = self._tokens[slot]
        if token_ids is None or tokens is None:
            self._tokens[slot] = None
            return
        tokens.extend(token_ids)
        if length // self.block_size > len(self._keys[slot]):  # a block was filled: index it
            self._index_full_blocks(slot)

    def _index_full_blocks(self, slot: int) -> None:
        tokens, keys, size = self._tokens[slot], self._keys[slot], self.block_size
        for index in range(len(keys), len(tokens) // size):
            keys.append(block_key(keys[-1] if keys else ROOT, tokens[index * size:(index + 1) * size]))
            if self.prefix is not None:
                self.prefix.register(keys[-1], self._tables[slot][index])

    def attach_prefix(self, slot: int, token_ids: list[int], keep: int = 1) -> int:
        """Put the cached blocks that continue ``slot`` with ``token_ids`` into its table (no compute),
        leaving at least the last ``keep`` tokens to compute; return how many tokens were attached.
        Only at a block boundary of a slot whose every token is known."""
        length, size = self.length(slot), self.block_size
        tokens, keys, table = self._tokens[slot], self._keys[slot], self._tables[slot]
        if self.prefix is None or tokens is None or length % size or len(table) != length // size:
            return 0
        attached = 0
        while attached + size <= len(token_ids) - keep:
            chunk = token_ids[attached:attached + size]
            key = block_key(keys[-1] if keys else ROOT, chunk)
            block = self.prefix.lookup(key)
            if block is None:
                break
            self.pool.share(block)
            table.append(block)
            self._table_view[slot, len(table) - 1] = block
            keys.append(key)
            tokens.extend(chunk)
            attached += size
        self._lengths[slot] += attached
        self._cached_tokens[slot] += attached
        return attached

    def cached_tokens(self, slot: int) -> int:
        """Tokens of ``slot`` taken from the prefix cache (not computed) since it was allocated."""
        self._check_allocated(slot)
        return self._cached_tokens[slot]

    def prepare(self, slot: int, num_tokens: int) -> None:
        """Make positions ``[length, length + num_tokens)`` of ``slot`` writable: allocate missing blocks
        and copy any shared block among them (copy-on-write). Call before a forward writes them."""
        self._check_allocated(slot)
        self._prepare_row(slot, self._lengths[slot], num_tokens)

    def prepare_rows(self, slots: list[int], counts: list[int]) -> None:
        """`prepare` for a forward's rows at once: ``counts[b]`` positions after slot ``slots[b]``'s
        end (the forward checked the slots, `check_forward_request`)."""
        lengths = self._lengths
        for slot, n in zip(slots, counts):
            self._prepare_row(slot, lengths[slot], n)

    def _prepare_row(self, slot: int, start: int, num_tokens: int) -> None:
        table, size = self._tables[slot], self.block_size
        first, end = start // size, _blocks_for(start + num_tokens, size)
        refcount = self.pool.refcount
        for index in range(first, min(end, len(table))):  # blocks already listed: usually the last one
            if refcount(table[index]) > 1:
                self._set_block(slot, index, self._copy_block(table[index]))
            elif self.prefix is not None and self.pool.is_cached(table[index]):
                self.prefix.forget(table[index])  # rewritten in place: no longer what its key says
        while len(table) < end:
            table.append(self.pool.allocate())
            self._table_view[slot, len(table) - 1] = table[-1]

    def fork(self, source: int, target: int, length: int) -> None:
        """Make empty slot ``target`` hold the first ``length`` tokens of ``source`` by sharing its blocks
        (no copy); 0 <= length <= length of source. The two then grow independently."""
        if not 0 <= length <= self.length(source):
            raise ValueError(f"fork: length={length} must be in [0, {self.length(source)}]")
        if self.length(target) or self._tables[target]:
            raise ValueError(f"fork: target slot {target} is not empty")
        shared = self._tables[source][: _blocks_for(length, self.block_size)]
        for index, block in enumerate(shared):
            self.pool.share(block)
            self._tables[target].append(block)
            self._table_view[target, index] = block
        self._lengths[target] = length
        source_tokens = self._tokens[source]
        self._tokens[target] = None if source_tokens is None else source_tokens[:length]
        self._keys[target] = self._keys[source][: length // self.block_size]

    def _copy_block(self, block: int) -> int:
        fresh = self.pool.allocate()
        self.copy_block(block, fresh)
        self.pool.release(block)
        return fresh

    def _set_block(self, slot: int, index: int, block: int) -> None:
        self._tables[slot][index] = block
        self._table_view[slot, index] = block

    def _drop_blocks(self, slot: int, keep: int) -> None:
        table = self._tables[slot]
        while len(table) > keep:
            self.pool.release(table.pop())
            self._table_view[slot, len(table)] = self.scratch_block

    def _check_allocated(self, slot: int) -> None:
        if type(slot) is int and 0 <= slot < self.num_slots and self._allocated[slot]:  # the usual case, fast
            return
        if not self.is_allocated(slot):
            index = _as_index(slot)
            in_range = index is not None and 0 <= index < self.num_slots
            state = "not allocated" if in_range else "out of range"
            raise InvalidSlotError(f"slot {slot!r} is {state} (num_slots={self.num_slots})")
