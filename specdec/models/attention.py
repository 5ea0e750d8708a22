"""Attention over a paged KV cache: the per-forward metadata every layer shares, causal / sliding-window
masks, and grouped-query attention (SDPA, or an explicit softmax when scores are soft-capped).

A batch's rows may sit at very different context lengths (a prompt chunk at 1,500 tokens beside
decode rows at 200): one attention read for all of them would read every row's cache up to the
longest. The rows are then split into a few *context groups* (`context_groups`), each reading
only up to its own longest row; the projections and the MLP still run once for the batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.models.padding_groups import padding_groups


GROUP_OVERHEAD_KV = 256  # one more attention read per layer, in cache rows read (row x position)


@dataclass
class ContextGroup:
    """Rows of a batch that read the cache together, up to their own longest context."""

    rows: torch.Tensor | None  # [g] int64 rows of the batch (None: all of them, in order)
    read_index: torch.Tensor  # [g, kv_len] int64, pool row of each row's cached positions 0 … kv_len-1
    masks: dict[int | None, torch.Tensor]  # sliding window -> [g, 1, seq, kv_len] bool, True = attend


@dataclass
class AttentionBatch:
    """Per-forward attention metadata shared by all layers."""

    write_index: torch.Tensor  # [batch, seq] int64, pool row receiving each token's K/V (scratch for padding)
    positions: torch.Tensor  # [batch, seq] int64, position of each token (padding: its row's last position)
    rotary: dict[str, tuple[torch.Tensor, torch.Tensor]]  # RoPE name -> (cos, sin), each [batch, seq, head_dim]
    kv_len: int  # cache prefix to read: max position in the batch + 1
    groups: list[ContextGroup]  # one per context group (usually one: rows None)


def context_groups(kv_lens: list[int], overhead: int = GROUP_OVERHEAD_KV) -> list[list[int]]:
    """Rows that read the cache together, by each row's context length (max position + 1): a
    group costs `overhead` + its rows x its longest context, split where that is cheaper
    (the same contiguous split of sorted lengths as `padding_groups`; equal contexts never split)."""
    if len(kv_lens) == 1 or len(kv_lens) * (max(kv_lens) - min(kv_lens)) <= overhead:
        return [list(range(len(kv_lens)))]  # no split can pay (and none is searched for)
    return padding_groups(kv_lens, overhead)


def attend(q: torch.Tensor, batch: AttentionBatch, gather, window: int | None, scale: float,
           softcap: float | None = None) -> torch.Tensor:
    """Each context group's queries over its rows' cache. q [batch, seq, heads, head_dim];
    gather(read_index) -> keys, values [g, kv_len, kv_heads, head_dim] -> [batch, seq, heads * head_dim]."""
    if len(batch.groups) == 1 and batch.groups[0].rows is None:
        keys, values = gather(batch.groups[0].read_index)
        return grouped_attention(q, keys, values, batch.groups[0].masks[window], scale, softcap)
    b, t, heads, head_dim = q.shape
    out = q.new_empty(b, t, heads * head_dim)
    for group in batch.groups:
        keys, values = gather(group.read_index)  # [g, kv_len, kv_heads, head_dim]
        out[group.rows] = grouped_attention(q[group.rows], keys, values, group.masks[window], scale, softcap)
    return out


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
