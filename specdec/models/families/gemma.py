"""Gemma 2 and Gemma 3 (text): the Llama layout with Gemma's changes.

Both: embeddings scaled by sqrt(hidden_size); RMSNorms that scale by (1 + weight) in float32;
GeGLU MLP (gelu-tanh gate); "sandwich" norms (the attention and MLP outputs are normed before
the residual add, the MLP input has its own norm); attention scaled by
``query_pre_attn_scalar ** -0.5``; interleaved sliding-window layers; tied embeddings by default.
Gemma 2 adds soft-capping of attention scores and of the final logits. Gemma 3 adds per-head
q/k norms and a RoPE of its own (``rope_local_base_freq``) on the sliding-window layers.
Missing keys take transformers' defaults for the family.
"""

from __future__ import annotations

from typing import Any

from specdec.models.config import (
    LlamaFamilyConfig,
    RopeConfig,
    UnsupportedModelError,
    check_activation,
    common_fields,
    parse_rope,
    sliding_windows,
)

_SHARED_DEFAULTS = {
    "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "tie_word_embeddings": True,
    "attention_bias": False, "rms_norm_eps": 1e-6,
}
_GEMMA2_DEFAULTS = {**_SHARED_DEFAULTS, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}
_GEMMA3_DEFAULTS = {
    **_SHARED_DEFAULTS, "final_logit_softcapping": None, "attn_logit_softcapping": None, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}


def parse_gemma2(raw: dict[str, Any]) -> LlamaFamilyConfig:
    """config.json of a gemma2 checkpoint -> its serving config (every other layer slides, from the first)."""
    raw = {**_GEMMA2_DEFAULTS, **raw}
    return LlamaFamilyConfig(**_gemma_fields(raw, pattern=2, rope=parse_rope(raw)))


def parse_gemma3(raw: dict[str, Any]) -> LlamaFamilyConfig:
    """config.json of a gemma3_text checkpoint -> its serving config (every sixth layer is full by default)."""
    raw = {**_GEMMA3_DEFAULTS, **raw}
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention=True (an encoder) cannot be served as a causal LM")
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        full = parse_rope(raw, params["full_attention"])
        sliding = parse_rope(raw, params.get("sliding_attention") or {"rope_theta": raw["rope_local_base_freq"]})
    else:
        full, sliding = parse_rope(raw), RopeConfig(theta=float(raw["rope_local_base_freq"]))
    fields = _gemma_fields(raw, pattern=pattern, rope=full)
    return LlamaFamilyConfig(**fields, qk_norm=True, sliding_rope=sliding)


def _gemma_fields(raw: dict[str, Any], pattern: int, rope: RopeConfig) -> dict[str, Any]:
    """What Gemma 2 and 3 read alike; ``pattern``: every pattern-th layer is full attention by default."""
    hidden_act = check_activation(raw, "hidden_activation", raw.get("hidden_act") or "gelu_pytorch_tanh",
                                  ("gelu_pytorch_tanh",))
    layers = raw["num_hidden_layers"]
    default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    bias = bool(raw["attention_bias"])
    return dict(
        **common_fields(raw, rope=rope),
        qkv_bias=bias,
        o_bias=bias,
        sliding_windows=sliding_windows(raw, raw["sliding_window"], default),
        hidden_act=hidden_act,
        unit_offset_norm=True,
        sandwich_norms=True,
        embed_scale=raw["hidden_size"] ** 0.5,
        query_scale=float(raw["query_pre_attn_scalar"]) ** -0.5,
        attn_softcap=_optional_float(raw["attn_logit_softcapping"]),
        final_softcap=_optional_float(raw["final_logit_softcapping"]),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
