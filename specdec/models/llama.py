"""Llama-family decoder (Llama, Qwen2/3, Mistral, Gemma 2/3, Phi-3) written for serving from a paged KV cache.

One forward handles B sequences x T new tokens at per-sequence positions: every row
writes its new K/V into its own cache slot and attends causally to that slot's prefix
plus its new tokens. This is how speculative verification of gamma+1 tokens for all
active requests runs as a single call. Parameter names mirror the Hugging Face
checkpoint layout (``model.layers.N.self_attn.q_proj.weight`` ...), so weights load as-is.
What later families change (q/k norms, Gemma's norms, GeGLU, scales, soft-capping, a second
RoPE for sliding-window layers) is switched on by fields of :class:`LlamaFamilyConfig`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.attention import AttentionBatch, ContextGroup, attend, build_attention_mask, context_groups
from specdec.models.config import LlamaFamilyConfig
from specdec.models.kv_cache import KVCache
from specdec.models.rope import RotaryEmbedding, apply_rotary


GLOBAL_ROPE, SLIDING_ROPE = "global", "sliding"
_ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32. Llama scales the normalised input, cast back to
    its dtype, by ``weight``; with ``unit_offset`` (Gemma) it scales by ``1 + weight`` before the cast."""

    def __init__(self, hidden_size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size) if unit_offset else torch.ones(hidden_size))
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden]."""
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (x32 * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * x32.to(x.dtype)


def make_norm(config: LlamaFamilyConfig, size: int | None = None) -> RMSNorm:
    """The family's RMSNorm over ``size`` features (default hidden_size)."""
    return RMSNorm(size or config.hidden_size, config.rms_norm_eps, config.unit_offset_norm)


class LlamaAttention(nn.Module):
    """Multi-head attention with grouped K/V heads reading and writing a paged KV cache.

    ``num_heads`` / ``num_kv_heads`` are the heads held by this module (per rank when sharded).
    """

    def __init__(self, config: LlamaFamilyConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.query_scale or config.head_dim**-0.5
        self.softcap = config.attn_softcap
        self.sliding_window = config.sliding_windows[layer_idx]
        sliding_rope = self.sliding_window is not None and config.sliding_rope is not None
        self.rope_name = SLIDING_ROPE if sliding_rope else GLOBAL_ROPE
        hidden, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, hidden, bias=config.o_bias)
        if config.qk_norm:  # one weight per head dimension, shared by every head (so unchanged by sharding)
            self.q_norm = make_norm(config, hd)
            self.k_norm = make_norm(config, hd)

    def forward(self, hidden: torch.Tensor, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """hidden [batch, seq, hidden] -> [batch, seq, hidden]; stores this layer's new K/V in ``cache``."""
        b, t, _ = hidden.shape
        q = self.q_proj(hidden).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(hidden).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden).view(b, t, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = batch.rotary[self.rope_name]
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        cache.write(self.layer_idx, batch.write_index, k, v)
        out = attend(q, batch, lambda index: cache.gather(self.layer_idx, index),  # [b, t, heads * hd]
                     self.sliding_window, self.scale, self.softcap)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)); act = silu (SwiGLU) or gelu-tanh (GeGLU)."""

    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.up_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inner, hidden, bias=config.mlp_bias)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden]."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)). With sandwich norms (Gemma)
    the block outputs are normed too: x + post_norm(attn(norm(x))), then x + post_ff(mlp(pre_ff(x)))."""

    def __init__(self, config: LlamaFamilyConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = make_norm(config)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = make_norm(config)
        self.mlp = LlamaMLP(config)
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(config)
            self.post_feedforward_layernorm = make_norm(config)

    def forward(self, hidden: torch.Tensor, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """hidden [batch, seq, hidden] -> [batch, seq, hidden]."""
        attn = self.self_attn(self.input_layernorm(hidden), batch, cache)
        if not self.sandwich:
            hidden = hidden + attn
            return hidden + self.mlp(self.post_attention_layernorm(hidden))
        hidden = hidden + self.post_attention_layernorm(attn)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class LlamaBackbone(nn.Module):
    """Embeddings, decoder layers and final norm (the ``model.`` prefix of HF checkpoints)."""

    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = make_norm(config)


class LlamaForServing(nn.Module):
    """Llama-family causal LM over a paged KV cache. See module docstring for the batching contract."""

    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tie_weights()
        self.rotary = {GLOBAL_ROPE: RotaryEmbedding(config.head_dim, config.rope)}
        if config.sliding_rope is not None:
            self.rotary[SLIDING_ROPE] = RotaryEmbedding(config.head_dim, config.sliding_rope)

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
        kv_len: int | list[int] | None = None,
    ) -> torch.Tensor:
        """Run the decoder; return final-norm hidden states [batch, seq, hidden].

        input_ids, positions: [batch, seq] int64; slot_ids: [batch] int64. Row b's tokens are written
        to slot ``slot_ids[b]`` at ``positions[b]`` and attend to cache entries ``[0, position]`` of
        that slot, so entries before ``positions[b, 0]`` must already hold the row's prefix and the
        new positions must have been made writable (`KVCache.prepare`).
        num_tokens [batch] (optional): row b's first ``num_tokens[b]`` tokens are real, the rest is
        right padding whose K/V is discarded and whose outputs are undefined.
        kv_len (optional): max real position + 1, to avoid a device sync when the caller knows it; or
        each row's (a list), so that rows at very different context lengths read the cache in
        groups, each up to its own longest (`context_groups`) instead of all up to the longest.
        """
        assert input_ids.dim() == 2 and positions.shape == input_ids.shape, (
            f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must both be [batch, seq]"
        )
        assert slot_ids.shape == input_ids.shape[:1], f"slot_ids {tuple(slot_ids.shape)} must be [batch]"
        batch = self._attention_batch(positions, cache, slot_ids, num_tokens, kv_len)
        hidden = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        if self.config.embed_scale is not None:
            hidden = hidden * torch.tensor(self.config.embed_scale, dtype=hidden.dtype, device=hidden.device)
        for layer in self.model.layers:
            hidden = layer(hidden, batch, cache)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> logits [..., vocab] in the model dtype (soft-capped if the family does)."""
        logits = self.lm_head(hidden)
        cap = self.config.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

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
        kv_len: int | list[int] | None,
    ) -> AttentionBatch:
        """Resolve padding, RoPE tables, masks and context groups once per forward."""
        b, t = positions.shape
        write_slots = slot_ids[:, None].expand(b, t)  # [batch, seq]
        if num_tokens is not None:
            assert num_tokens.shape == (b,), f"num_tokens {tuple(num_tokens.shape)} must be [batch]"
            valid = torch.arange(t, device=positions.device) < num_tokens[:, None]  # [batch, seq]
            last = positions.gather(1, (num_tokens - 1)[:, None])  # [batch, 1]
            positions = torch.where(valid, positions, last)
            write_slots = torch.where(valid, write_slots, cache.scratch_slot)
        row_lens = kv_len if isinstance(kv_len, list) else None
        if row_lens is not None:
            kv_len = max(row_lens)
        elif kv_len is None:
            kv_len = int(positions.max().item()) + 1
        rotary = {name: rope.cos_sin(positions, self.dtype) for name, rope in self.rotary.items()}
        groups = self._context_groups(positions, cache, slot_ids, row_lens or [kv_len] * b)
        write_index = cache.flat_index(write_slots, positions)  # [batch, seq]
        return AttentionBatch(write_index, positions, rotary, kv_len, groups)

    def _context_groups(self, positions: torch.Tensor, cache: KVCache, slot_ids: torch.Tensor,
                        row_lens: list[int]) -> list[ContextGroup]:
        """The rows' cache reads and masks, by context group (`context_groups`; one group of all
        rows, up to the longest, when splitting does not pay). positions [batch, seq]."""
        windows = {layer.self_attn.sliding_window for layer in self.model.layers}
        split = context_groups(row_lens)
        groups = []
        for rows in split:
            index = None if len(split) == 1 else torch.tensor(rows, dtype=torch.long, device=positions.device)
            group_positions = positions if index is None else positions[index]  # [g, seq]
            group_slots = slot_ids if index is None else slot_ids[index]  # [g]
            group_len = max(row_lens[i] for i in rows)
            masks = {w: build_attention_mask(group_positions, group_len, w) for w in windows}  # [g, 1, seq, kv_len]
            groups.append(ContextGroup(index, cache.read_index(group_slots, group_len), masks))
        return groups
