"""Packed token masks: which tokens a grammar allows at each verified position.

A mask is int32 words, one bit per token: bit j of word i set = token 32 * i + j allowed
(xgrammar's layout). A row's masks for one round are [num_drafted + 1, W] (position i: after
the history and the drafted tokens before it), W = ceil(vocab / 32). Applying them needs
torch alone, so a target worker enforces a grammar it never compiled: the router's matcher
makes the masks and they travel as bytes (little-endian int32).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

ALL_ALLOWED = -1  # an int32 word with every bit set

_BITS = torch.arange(32, dtype=torch.int32)  # [32]


def unpack(masks: Tensor, vocab_size: int) -> Tensor:
    """[..., W] int32 packed masks -> [..., vocab_size] bool (True = allowed), on the masks' device."""
    if masks.device.type == "cpu":  # numpy's bit unpacking: one pass, no [..., W, 32] int32 temporaries
        words = np.ascontiguousarray(masks.numpy(), dtype="<i4").view(np.uint8)  # [..., 4W]: bytes, LSB first
        return torch.from_numpy(np.unpackbits(words, axis=-1, bitorder="little")[..., :vocab_size].view(np.bool_))
    bits = (masks[..., None] >> _BITS.to(masks.device)) & 1  # [..., W, 32]
    return bits.reshape(*masks.shape[:-1], -1)[..., :vocab_size].bool()


def apply_masks(logits: Tensor, masks: Tensor) -> Tensor:
    """logits [..., V] with the tokens each mask forbids set to -inf; masks [..., W] int32
    (ALL_ALLOWED words where a row has no grammar), e.g. [B, T, W] for a verify's positions."""
    allowed = unpack(masks.to(logits.device), logits.shape[-1])  # [B, T, V]
    return logits.masked_fill(~allowed, float("-inf"))


def batch_masks(rows: list[Tensor | None], positions: int, vocab_size: int) -> Tensor | None:
    """Each row's masks ([n_b, W] int32, n_b <= positions, or None = no grammar) as one
    [B, positions, W] tensor, ALL_ALLOWED where a row has none; None when no row has any."""
    if all(r is None for r in rows):
        return None
    width = (vocab_size + 31) // 32
    out = torch.full((len(rows), positions, width), ALL_ALLOWED, dtype=torch.int32)
    for b, row in enumerate(rows):
        if row is not None:
            out[b, : row.shape[0]] = row
    return out


def to_bytes(masks: Tensor | None) -> bytes:
    """A row's masks for the wire (b"" = none)."""
    return b"" if masks is None else masks.numpy().astype("<i4", copy=False).tobytes()


def from_bytes(data: bytes, positions: int) -> Tensor | None:
    """A row's masks [positions, W] from the wire (None for b""); ValueError when the bytes
    do not split into `positions` whole masks."""
    if not data:
        return None
    if positions < 1 or len(data) % (4 * positions):
        raise ValueError(f"token_mask: {len(data)} bytes are no {positions} masks of int32 words")
    words = np.frombuffer(data, dtype="<i4").astype(np.int32)
    return torch.from_numpy(words.reshape(positions, -1))
