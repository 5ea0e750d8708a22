"""CacheAdmission: admission to a paged KV cache counted in blocks, not ``max_seq_len`` slots.

Each live sequence may grow to its *reserve* (``max_seq_len`` unless `KVCache.allocate` is told
fewer tokens). Blocks not yet taken up to each live reserve are *owed*, as is one copy of a shared,
partly filled last block; `num_free` counts the worst-case sequences the blocks neither taken nor
owed still hold, so a sequence admitted never fails to grow within its reserve. `grow` raises a live
sequence's reserve when the unowed blocks cover it (the engine admits on a prompt + a few tokens
and grows reserves as sequences decode; it preempts when they do not fit).

A part of `KVCache`: it reads the cache's block tables, lengths and live slots, declared below.
"""

from __future__ import annotations

from specdec.models.block_pool import BlockPool
from specdec.models.pool_sizing import blocks_for as _blocks_for


class CacheAdmission:
    """What `KVCache` admits and how far its live sequences may grow (see the module docstring)."""

    # the cache's state this reads (KVCache sets it)
    pool: BlockPool
    block_size: int
    blocks_per_seq: int
    max_seq_len: int
    _tables: list[list[int]]  # block ids of each slot, in position order
    _lengths: list[int]  # tokens of each slot
    _reserve: list[int]  # blocks each live slot may grow to
    _live: set[int]  # allocated slots
    _free_heap: list[int]  # slots not allocated

    def _check_allocated(self, slot: int) -> None:
        """InvalidSlotError unless ``slot`` is allocated (KVCache's)."""
        raise NotImplementedError

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
        return 1.0 - max(0, self._headroom()) / self.pool.num_blocks

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
