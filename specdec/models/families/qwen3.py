"""Qwen3: the Qwen2 layout with a per-head RMSNorm of queries and keys (before RoPE), no q/k/v biases
unless ``attention_bias`` (then o_proj has one too), and ``head_dim`` read from the config."""

from __future__ import annotations

from typing import Any

from specdec.models.config import LlamaFamilyConfig, check_activation, common_fields
from specdec.models.families.llama import qwen_windows


def parse(raw: dict[str, Any]) -> LlamaFamilyConfig:
    """config.json of a qwen3 checkpoint -> its serving config."""
    raw = {"head_dim": 128, **raw}  # transformers' Qwen3Config default
    check_activation(raw, "hidden_act", "silu", ("silu",))
    bias = bool(raw.get("attention_bias", False))
    return LlamaFamilyConfig(
        **common_fields(raw), qkv_bias=bias, o_bias=bias, sliding_windows=qwen_windows(raw), qk_norm=True
    )
