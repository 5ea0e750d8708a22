"""BlockPool: the free list, reference counts and prefix-cache retention of a paged KV cache's blocks.

A block holds ``block_size`` tokens' K/V in every layer. A sequence's block table lists the
blocks it reads; a block listed by several tables (a look-ahead fork and its source share
their prefix, requests share a cached prompt prefix) has a reference count above one and is
never written in place: the writer copies it first (copy-on-write, `KVCache.prepare`).

When its last reference is released a block is free again, unless the prefix cache indexes
it (`mark_cached`): then it stays *evictable*, still readable by a later request with the
same prefix (`revive`), until an allocation finds no never-used block and evicts the least
recently released one (``on_evict`` lets the index forget it).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable


class CacheFullError(RuntimeError):
    """The cache has no room for another sequence (or another block of a growing one)."""


class BlockPool:
    """Block ids ``0 … num_blocks-1``: which are free or evictable, and how many tables reference each."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self._refcounts = [0] * num_blocks
        self._free_heap = list(range(num_blocks))  # lowest free block first: deterministic layouts
        self._cached: set[int] = set()  # blocks the prefix cache indexes
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest release first
        self.on_evict: Callable[[int], None] = lambda block: None

    @property
    def num_free(self) -> int:
        """Blocks no table references (never used, or cached and evictable)."""
        return len(self._free_heap) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        """Unreferenced blocks kept for the prefix cache."""
        return len(self._evictable)

    def allocate(self) -> int:
        """A block with one reference: a never-used one, else the least recently released cached one
        (evicted); CacheFullError when every block is referenced."""
        if self._free_heap:
            block = heapq.heappop(self._free_heap)
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self.uncache(block)
            self.on_evict(block)
        else:
            raise CacheFullError(f"KV cache is full: all {self.num_blocks} blocks are in use")
        self._refcounts[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more table references ``block`` (a fork, or a prefix hit); an evictable block is revived."""
        if self._refcounts[block] == 0:
            assert block in self._evictable, f"block {block} is free"
            del self._evictable[block]
        self._refcounts[block] += 1

    def release(self, block: int) -> None:
        """One table fewer references ``block``; after its last release it is free, or evictable if cached."""
        assert self._refcounts[block] > 0, f"block {block} is already free"
        self._refcounts[block] -= 1
        if self._refcounts[block] == 0:
            if block in self._cached:
                self._evictable[block] = None
            else:
                heapq.heappush(self._free_heap, block)

    def refcount(self, block: int) -> int:
        """How many tables reference ``block`` (0: free or evictable)."""
        return self._refcounts[block]

    def mark_cached(self, block: int) -> None:
        """The prefix cache indexes ``block`` (referenced): keep it evictable after its last release."""
        assert self._refcounts[block] > 0, f"block {block} is not referenced"
        self._cached.add(block)

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def uncache(self, block: int) -> None:
        """The prefix cache no longer indexes ``block`` (it is about to be rewritten, or was evicted)."""
        self._cached.discard(block)
        if block in self._evictable:
            del self._evictable[block]
            heapq.heappush(self._free_heap, block)
