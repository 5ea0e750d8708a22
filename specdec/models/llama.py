"""Llama-family decoder (Llama, Qwen2, Mistral) written for serving from a slot KV cache.

One forward handles B sequences x T new tokens at per-sequence positions: every row
writes its new K/V into its own cache slot and attends causally to that slot's prefix
plus its new tokens. This is how speculative verification of gamma+1 tokens for all
active requests runs as a single call. Parameter names mirror the Hugging Face
checkpoint layout (``model.layers.N.self_attn.q_proj.weight`` ...), so weights load as-is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.config import LlamaFamilyConfig
from specdec.models.kv_cache import KVCache
from specdec.models.rope import RotaryEmbedding, apply_rotary


@dataclass
class AttentionBatch:
    """Per-forward attention metadata shared by all layers."""

    slot_ids: torch.Tensor  # [batch] int64, slot of each row
    write_slots: torch.Tensor  # [batch, seq] int64, slot receiving each token's K/V (scratch for padding)
    positions: torch.Tensor  # [batch, seq] int64, position of each token (padding: its row's last position)
    cos: torch.Tensor  # [batch, seq, head_dim]
    sin: torch.Tensor  # [batch, seq, head_dim]
    kv_len: int  # cache prefix to read: max position in the batch + 1
    masks: dict[int | None, torch.Tensor]  # sliding window -> [batch, 1, seq, kv_len] bool, True = attend


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden]."""
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """GQA via SDPA without materialising repeated K/V: each KV head's query group is folded into the
    sequence axis. q [batch, seq, heads, head_dim]; k, v [batch, kv_len, kv_heads, head_dim];
    mask [batch, 1, seq, kv_len] -> [batch, seq, heads * head_dim]."""
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    assert heads % kv_heads == 0 and k.shape == v.shape and mask.shape[-2:] == (seq, k.shape[1])
    groups = heads // kv_heads
    q = q.view(batch, seq, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)  # [b, kvh, g, seq, hd]
    q = q.reshape(batch, kv_heads, groups * seq, head_dim)
    mask = mask.repeat(1, 1, groups, 1)  # [batch, 1, groups * seq, kv_len]
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale)
    out = out.view(batch, kv_heads, groups, seq, head_dim).permute(0, 3, 1, 2, 4)  # [b, seq, kvh, g, hd]
    return out.reshape(batch, seq, heads * head_dim)


class LlamaAttention(nn.Module):
    """Multi-head attention with grouped K/V heads reading and writing a slot KV cache.

    ``num_heads`` / ``num_kv_heads`` are the heads held by this module (per rank when sharded).
    """

    def __init__(self, config: LlamaFamilyConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.sliding_window = config.sliding_windows[layer_idx]
        hidden, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, hidden, bias=config.o_bias)

    def forward(self, hidden: torch.Tensor, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """hidden [batch, seq, hidden] -> [batch, seq, hidden]; stores this layer's new K/V in ``cache``."""
        b, t, _ = hidden.shape
        q = self.q_proj(hidden).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(hidden).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden).view(b, t, self.num_kv_heads, self.head_dim)
        q = apply_rotary(q, batch.cos, batch.sin)
        k = apply_rotary(k, batch.cos, batch.sin)
        cache.write(self.layer_idx, batch.write_slots, batch.positions, k, v)
        keys, values = cache.gather(self.layer_idx, batch.slot_ids, batch.kv_len)  # [b, kv_len, kvh, hd]
        out = grouped_attention(q, keys, values, batch.masks[self.sliding_window], self.scale)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.up_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inner, hidden, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaFamilyConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden: torch.Tensor, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """hidden [batch, seq, hidden] -> [batch, seq, hidden]."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), batch, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaBackbone(nn.Module):
    """Embeddings, decoder layers and final norm (the ``model.`` prefix of HF checkpoints)."""

    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForServing(nn.Module):
    """Llama-family causal LM over a slot KV cache. See module docstring for the batching contract."""

    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tie_weights()
        self.rotary = RotaryEmbedding(config.head_dim, config.rope)

    def tie_weights(self) -> None:
        """Share the embedding matrix with the output projection."""
        self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def num_local_kv_heads(self) -> int:
        """K/V heads held by this (possibly tensor-parallel-sharded) model: the KV cache width."""
        return self.model.layers[0].self_attn.num_kv_heads

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection (may exceed the tokenizer's vocabulary)."""
        return self.lm_head.weight.shape[0]

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slot_ids: torch.Tensor,
        num_tokens: torch.Tensor | None = None,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Run the decoder; return final-norm hidden states [batch, seq, hidden].

        input_ids, positions: [batch, seq] int64; slot_ids: [batch] int64. Row b's tokens are written
        to slot ``slot_ids[b]`` at ``positions[b]`` and attend to cache entries ``[0, position]`` of
        that slot, so entries before ``positions[b, 0]`` must already hold the row's prefix.
        num_tokens [batch] (optional): row b's first ``num_tokens[b]`` tokens are real, the rest is
        right padding whose K/V is discarded and whose outputs are undefined.
        kv_len (optional): max real position + 1, to avoid a device sync when the caller knows it.
        """
        assert input_ids.dim() == 2 and positions.shape == input_ids.shape, (
            f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must both be [batch, seq]"
        )
        assert slot_ids.shape == input_ids.shape[:1], f"slot_ids {tuple(slot_ids.shape)} must be [batch]"
        batch = self._attention_batch(positions, cache, slot_ids, num_tokens, kv_len)
        hidden = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        for layer in self.model.layers:
            hidden = layer(hidden, batch, cache)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> logits [..., vocab] in the model dtype."""
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slot_ids: torch.Tensor,
        num_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Same contract as :meth:`forward_hidden`; returns logits [batch, seq, vocab]."""
        return self.compute_logits(self.forward_hidden(input_ids, positions, cache, slot_ids, num_tokens))

    def _attention_batch(
        self,
        positions: torch.Tensor,
        cache: KVCache,
        slot_ids: torch.Tensor,
        num_tokens: torch.Tensor | None,
        kv_len: int | None,
    ) -> AttentionBatch:
        """Resolve padding, RoPE tables and masks once per forward."""
        b, t = positions.shape
        write_slots = slot_ids[:, None].expand(b, t)  # [batch, seq]
        if num_tokens is not None:
            assert num_tokens.shape == (b,), f"num_tokens {tuple(num_tokens.shape)} must be [batch]"
            valid = torch.arange(t, device=positions.device) < num_tokens[:, None]  # [batch, seq]
            last = positions.gather(1, (num_tokens - 1)[:, None])  # [batch, 1]
            positions = torch.where(valid, positions, last)
            write_slots = torch.where(valid, write_slots, cache.scratch_slot)
        if kv_len is None:
            kv_len = int(positions.max().item()) + 1
        cos, sin = self.rotary.cos_sin(positions, self.dtype)
        windows = {layer.self_attn.sliding_window for layer in self.model.layers}
        masks = {w: build_attention_mask(positions, kv_len, w) for w in windows}
        return AttentionBatch(slot_ids, write_slots, positions, cos, sin, kv_len, masks)
