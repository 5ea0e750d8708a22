"""PrefixIndex: full KV-cache blocks addressed by the tokens they hold and every token before them.

A block's K/V depend only on the token ids up to its last position, so a block filled by one
request serves any later request whose text starts the same way (a shared system prompt, a
chat's earlier turns), in the target and in the draft alike. The key of block i of a sequence
is a digest chained from block i-1's key and block i's token ids, so equal keys mean equal
whole prefixes (no per-block comparison needed). The index holds a block while its content is
unchanged: `KVCache.prepare` forgets a block before rewriting it in place, and the pool
forgets an evicted one (least recently released first).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from specdec.models.block_pool import BlockPool

ROOT = b""  # the key "before" a sequence's first block


def block_key(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The key of a full block holding ``token_ids`` after the prefix keyed ``parent``."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


class PrefixIndex:
    """key -> block for full blocks whose content is still what the key says."""

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        pool.on_evict = self._evicted

    def __len__(self) -> int:
        return len(self._block_of)

    def lookup(self, key: bytes) -> int | None:
        """The block holding the prefix ``key`` names, or None."""
        return self._block_of.get(key)

    def register(self, key: bytes, block: int) -> None:
        """Index a just-filled, referenced block (first come: a duplicate of a known key is not kept)."""
        if key in self._block_of or block in self._key_of:
            return
        self._block_of[key], self._key_of[block] = block, key
        self._pool.mark_cached(block)

    def forget(self, block: int) -> None:
        """Stop indexing ``block`` (its content is about to change)."""
        if self._evicted(block):
            self._pool.uncache(block)

    def _evicted(self, block: int) -> bool:
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
        return key is not None
