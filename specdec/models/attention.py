"""Attention over a paged KV cache: the per-forward metadata every layer shares, causal / sliding-window
masks, and grouped-query attention (SDPA, or an explicit softmax when scores are soft-capped)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionBatch:
    """Per-forward attention metadata shared by all layers."""

    write_index: torch.Tensor  # [batch, seq] int64, pool row receiving each token's K/V (scratch for padding)
    read_index: torch.Tensor  # [batch, kv_len] int64, pool row of each row's cached positions 0 … kv_len-1
    positions: torch.Tensor  # [batch, seq] int64, position of each token (padding: its row's last position)
    rotary: dict[str, tuple[torch.Tensor, torch.Tensor]]  # RoPE name -> (cos, sin), each [batch, seq, head_dim]
    kv_len: int  # cache prefix to read: max position in the batch + 1
    masks: dict[int | None, torch.Tensor]  # sliding window -> [batch, 1, seq, kv_len] bool, True = attend


def build_attention_mask(positions: torch.Tensor, kv_len: int, window: int | None) -> torch.Tensor:
    """Causal (optionally sliding-window) mask [batch, 1, seq, kv_len]: key j visible to query at p iff j <= p
    (and j > p - window)."""
    assert positions.dim() == 2, f"positions must be [batch, seq], got {tuple(positions.shape)}"
    key_pos = torch.arange(kv_len, device=positions.device)  # [kv_len]
    query_pos = positions[:, :, None]  # [batch, seq, 1]
    allowed = key_pos <= query_pos  # [batch, seq, kv_len]
    if window is not None:
        allowed &= key_pos > query_pos - window
    return allowed[:, None]


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """GQA without materialising repeated K/V: each KV head's query group is folded into the sequence axis.
    q [batch, seq, heads, head_dim]; k, v [batch, kv_len, kv_heads, head_dim]; mask [batch, 1, seq, kv_len]
    -> [batch, seq, heads * head_dim]. ``softcap``: scores become cap * tanh(scores / cap) before the mask."""
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    assert heads % kv_heads == 0 and k.shape == v.shape and mask.shape[-2:] == (seq, k.shape[1])
    groups = heads // kv_heads
    q = q.view(batch, seq, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)  # [b, kvh, g, seq, hd]
    q = q.reshape(batch, kv_heads, groups * seq, head_dim)
    mask = mask.repeat(1, 1, groups, 1)  # [batch, 1, groups * seq, kv_len]
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [batch, kv_heads, kv_len, head_dim]
    if softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:
        out = _softcapped_attention(q, k, v, mask, scale, softcap)  # [b, kvh, g * seq, hd]
    out = out.view(batch, kv_heads, groups, seq, head_dim).permute(0, 3, 1, 2, 4)  # [b, seq, kvh, g, hd]
    return out.reshape(batch, seq, heads * head_dim)


def _softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """softmax(cap * tanh(q k^T * scale / cap), masked) v, the softmax in float32 (SDPA has no soft-cap).
    q [b, h, n, hd]; k, v [b, h, kv_len, hd]; mask [b, 1, n, kv_len] -> [b, h, n, hd]."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, n, kv_len]
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)
