"""Llama, Qwen2 and Mistral: the plain pre-norm SwiGLU decoder.

``llama`` may have attention / MLP biases, ``qwen2`` always has q/k/v biases and optional
sliding-window layers (from ``max_window_layers`` on), ``mistral`` an optional window on every layer.
"""

from __future__ import annotations

from typing import Any

from specdec.models.config import LlamaFamilyConfig, check_activation, common_fields, sliding_windows


def parse(raw: dict[str, Any]) -> LlamaFamilyConfig:
    """config.json of a llama / qwen2 / mistral checkpoint -> its serving config."""
    model_type = raw["model_type"]
    check_activation(raw, "hidden_act", "silu", ("silu",))
    return LlamaFamilyConfig(
        **common_fields(raw), **_bias_flags(model_type, raw), sliding_windows=_windows(model_type, raw)
    )


def _bias_flags(model_type: str, raw: dict[str, Any]) -> dict[str, bool]:
    if model_type == "qwen2":
        return {"qkv_bias": True, "o_bias": False, "mlp_bias": False}
    if model_type == "llama":
        attn = bool(raw.get("attention_bias", False))
        return {"qkv_bias": attn, "o_bias": attn, "mlp_bias": bool(raw.get("mlp_bias", False))}
    return {"qkv_bias": False, "o_bias": False, "mlp_bias": False}


def _windows(model_type: str, raw: dict[str, Any]) -> tuple[int | None, ...]:
    layers = raw["num_hidden_layers"]
    if model_type == "llama":
        return (None,) * layers
    if model_type == "qwen2":
        return qwen_windows(raw)
    return sliding_windows(raw, raw.get("sliding_window"))


def qwen_windows(raw: dict[str, Any]) -> tuple[int | None, ...]:
    """Qwen's rule: a window only with ``use_sliding_window``, on the layers from ``max_window_layers`` on."""
    layers = raw["num_hidden_layers"]
    window = raw.get("sliding_window") if raw.get("use_sliding_window", False) else None
    first = raw.get("max_window_layers", layers)
    default = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    return sliding_windows(raw, window, default)
