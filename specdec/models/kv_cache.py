"""Paged key/value cache for serving.

K/V live in a per-layer pool of fixed-size blocks ``[num_blocks + 1, block_size, num_kv_heads,
head_dim]``; each sequence (a *slot* id, as the engine knows it) has a block table mapping its
positions to blocks, so memory is taken as a sequence grows (`prepare`) and returned when it
ends (`free`), not reserved for ``max_seq_len`` up front.

* Rollback (`truncate`) is length bookkeeping plus the eager release of whole blocks past the
  new length: O(blocks dropped), one or two for a rejected draft.
* A fork (`fork`) lists its source's prefix blocks in its own table (reference counts, no copy);
  a write into a block another table still references copies that block first (copy-on-write),
  so a fork never changes what its source reads, nor the reverse.
* Prefix caching: a full block is indexed by its tokens and all before them (`PrefixIndex`);
  `attach_prefix` lists the indexed blocks a new prompt starts with in its table, so only the
  rest is computed. Unreferenced indexed blocks stay readable until evicted (LRU, `BlockPool`).
* Admission: each live sequence may grow to its *reserve* (``max_seq_len`` unless `allocate`
  is told fewer tokens), and `num_free` counts the worst-case sequences the blocks not owed to
  live ones still hold, so a sequence admitted never fails to grow within its reserve. `grow`
  raises a live sequence's reserve when the unowed blocks cover it (the engine admits on a
  prompt + a few tokens and grows reserves as sequences decode; it preempts when they do not fit).

The extra block ``num_blocks`` is *scratch*: the padding tokens of ragged batches write there
(slot ``scratch_slot``'s table points only to it), and unused table entries point there too.
"""

from __future__ import annotations

import heapq
import operator

import torch

from specdec.models.block_pool import BlockPool, CacheFullError
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


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")


class KVCache:
    """Block pools per layer, block tables and lengths per slot (see the module docstring)."""

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
        _check_positive(num_layers=num_layers, num_slots=num_slots, max_seq_len=max_seq_len,
                        num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size)
        self.num_layers, self.num_slots, self.max_seq_len = num_layers, num_slots, max_seq_len
        self.num_kv_heads, self.head_dim, self.block_size = num_kv_heads, head_dim, block_size
        self.blocks_per_seq = _blocks_for(max_seq_len, block_size)
        num_blocks = num_slots * self.blocks_per_seq if num_blocks is None else num_blocks
        if num_blocks < self.blocks_per_seq:
            raise ValueError(f"num_blocks={num_blocks} cannot hold one sequence of max_seq_len={max_seq_len} "
                             f"({self.blocks_per_seq} blocks of {block_size} tokens)")
        self.pool = BlockPool(num_blocks)
        self.prefix = PrefixIndex(self.pool) if prefix_caching else None
        self.scratch_slot, self.scratch_block = num_slots, num_blocks
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # [num_slots + 1, blocks_per_seq]: block of each (slot, position // block_size); mirrors _tables
        self.block_table = torch.full((num_slots + 1, self.blocks_per_seq), num_blocks, dtype=torch.long,
                                      device=device)
        # entries written from the host: through a NumPy view of the table's own memory on the CPU (a
        # tensor write per entry costs microseconds of dispatch), else the tensor itself
        self._table_view = self.block_table.numpy() if self.block_table.device.type == "cpu" else self.block_table
        self._tables: list[list[int]] = [[] for _ in range(num_slots)]
        self._lengths = [0] * num_slots
        self._reserve = [0] * num_slots  # blocks each live slot may grow to
        self._allocated = [False] * num_slots
        self._live: set[int] = set()  # allocated slots: what admission walks, whatever num_slots is
        self._tokens: list[list[int] | None] = [None] * num_slots  # token ids, while every write came with them
        self._keys: list[list[bytes]] = [[] for _ in range(num_slots)]  # prefix key of each full block
        self._cached_tokens = [0] * num_slots  # tokens taken from the prefix cache
        self._free_heap = list(range(num_slots))  # lowest free slot is handed out first

    # ----------------------------------------------------------------- sequences
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @staticmethod
    def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one block takes: K and V of ``block_size`` tokens in every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    @property
    def num_free(self) -> int:
        """Sequences of up to ``max_seq_len`` tokens that can still be allocated, each sure to fit."""
        return max(0, min(len(self._free_heap), self._headroom() // self.blocks_per_seq))

    @property
    def num_live(self) -> int:
        """Sequences (and forks) allocated now."""
        return len(self._live)

    @property
    def usage(self) -> float:
        """Share of the blocks taken or owed to live sequences' reserves (what admission cannot give)."""
        return 1.0 - max(0, self._headroom()) / self.num_blocks

    def _headroom(self) -> int:
        """Free blocks not owed to live slots growing to their reserves (may be negative only when a
        slot grew past its reserve)."""
        live = list(self._live)  # a copy: num_free may be read from another thread
        owed = sum(max(0, self._reserve[s] - len(self._tables[s])) for s in live)
        writers: dict[int, int] = {}  # shared, partly filled last block -> tables that will write into it
        for slot in live:
            table = self._tables[slot][-1:]  # a copy, for the same reason
            if table and self._lengths[slot] % self.block_size and self.pool.refcount(table[0]) > 1:
                writers[table[0]] = writers.get(table[0], 0) + 1
        # each writer copies the block first, except the last one when no other table reads it then
        copies = sum(n - (1 if n == self.pool.refcount(block) else 0) for block, n in writers.items())
        return self.pool.num_free - owed - copies

    def _reserve_blocks(self, reserve_tokens: int | None) -> int:
        """Blocks a sequence reserving ``reserve_tokens`` (None or 0: ``max_seq_len``) may grow to."""
        if not reserve_tokens:
            return self.blocks_per_seq
        return _blocks_for(min(max(reserve_tokens, 1), self.max_seq_len), self.block_size)

    def admits(self, reserve_tokens: list[int | None]) -> int:
        """How many of these new sequences, taken in order, `allocate` would accept now (each sure to
        grow to its reserve): admission by blocks, not by ``max_seq_len`` slots."""
        headroom, slots = self._headroom(), len(self._free_heap)
        for count, reserve in enumerate(reserve_tokens):
            blocks = self._reserve_blocks(reserve)
            if count >= slots or blocks > headroom:
                return count
            headroom -= blocks
        return len(reserve_tokens)

    def grow(self, reserves: list[tuple[int, int]], taken: list[int | None] = ()) -> int:
        """Raise live slots' reserves, in order ((slot, tokens) each), while the blocks not owed cover
        the increase, after the reserves of ``taken`` sequences not allocated yet; return how many were
        raised (it stops at the first that does not fit). A reserve never shrinks here."""
        headroom = self._headroom() - sum(self._reserve_blocks(tokens) for tokens in taken)
        for count, (slot, tokens) in enumerate(reserves):
            self._check_allocated(slot)
            blocks = self._reserve_blocks(tokens)
            extra = max(0, blocks - max(self._reserve[slot], len(self._tables[slot])))
            if extra > headroom:
                return count
            headroom -= extra
            self._reserve[slot] = max(self._reserve[slot], blocks)
        return len(reserves)

    def reserve_tokens(self, slot: int) -> int:
        """The tokens ``slot`` may grow to (its reserve, in whole blocks)."""
        self._check_allocated(slot)
        return self._reserve[slot] * self.block_size

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
        for keys, values in zip(self.keys, self.values):
            keys[fresh] = keys[block]
            values[fresh] = values[block]
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

    # ----------------------------------------------------------------- tensor access
    def flat_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Row of each (slot, position) in a layer's pool viewed as [(num_blocks + 1) * block_size, ...];
        ``slots`` and ``positions`` broadcast (int64, positions < max_seq_len)."""
        blocks = self.block_table[slots, positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size

    def read_index(self, slot_ids: torch.Tensor, kv_len: int) -> torch.Tensor:
        """[batch, kv_len] pool rows of each slot's first ``kv_len`` positions (slot_ids: [batch])."""
        assert slot_ids.dim() == 1, f"slot_ids must be [batch], got {tuple(slot_ids.shape)}"
        assert 1 <= kv_len <= self.max_seq_len, f"kv_len={kv_len} out of [1, {self.max_seq_len}]"
        return self.flat_index(slot_ids[:, None], torch.arange(kv_len, device=slot_ids.device)[None])

    def write(self, layer: int, index: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store K/V of new tokens at pool rows ``index`` (from `flat_index`, e.g. [batch, seq]);
        keys, values: [*index.shape, num_kv_heads, head_dim]. Rows must have been `prepare`d."""
        assert keys.shape == values.shape == (*index.shape, self.num_kv_heads, self.head_dim), (
            f"index {tuple(index.shape)}, keys {tuple(keys.shape)}, values {tuple(values.shape)}")
        rows, width = index.reshape(-1), (-1, self.num_kv_heads, self.head_dim)
        self.keys[layer].view(width).index_copy_(0, rows, keys.reshape(width))
        self.values[layer].view(width).index_copy_(0, rows, values.reshape(width))

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at pool rows ``index`` (e.g. `read_index`'s [batch, kv_len]), each
        [*index.shape, kv_heads, head_dim]."""
        rows, width, shape = index.reshape(-1), (-1, self.num_kv_heads, self.head_dim), index.shape
        keys = self.keys[layer].view(width).index_select(0, rows)  # [rows, kv_heads, head_dim]
        values = self.values[layer].view(width).index_select(0, rows)
        return keys.view(*shape, *width[1:]), values.view(*shape, *width[1:])
