"""BlockPool: the free list and reference counts of a paged KV cache's fixed-size blocks.

A block holds ``block_size`` tokens' K/V in every layer. A sequence's block table lists the
blocks it reads; a block listed by several tables (a look-ahead fork and its source share
their prefix) has a reference count above one and is never written in place: the writer
copies it first (copy-on-write, `KVCache.prepare`). A block returns to the free list when
its last reference is released.
"""

from __future__ import annotations

import heapq


class CacheFullError(RuntimeError):
    """The cache has no room for another sequence (or another block of a growing one)."""


class BlockPool:
    """Block ids ``0 … num_blocks-1``: which are free, and how many tables reference each."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self._refcounts = [0] * num_blocks
        self._free_heap = list(range(num_blocks))  # lowest free block first: deterministic layouts

    @property
    def num_free(self) -> int:
        """Blocks no table references."""
        return len(self._free_heap)

    def allocate(self) -> int:
        """A free block with one reference; CacheFullError when none is left."""
        if not self._free_heap:
            raise CacheFullError(f"KV cache is full: all {self.num_blocks} blocks are in use")
        block = heapq.heappop(self._free_heap)
        self._refcounts[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more table references ``block`` (a fork)."""
        assert self._refcounts[block] > 0, f"block {block} is free"
        self._refcounts[block] += 1

    def release(self, block: int) -> None:
        """One table fewer references ``block``; it is free again after its last release."""
        assert self._refcounts[block] > 0, f"block {block} is already free"
        self._refcounts[block] -= 1
        if self._refcounts[block] == 0:
            heapq.heappush(self._free_heap, block)

    def refcount(self, block: int) -> int:
        """How many tables reference ``block`` (0: free)."""
        return self._refcounts[block]
