"""Architecture description of a Llama-family checkpoint, parsed from its ``config.json``.

Only what the serving model needs is kept. Supported layouts: ``llama`` (optional
attention / MLP biases), ``qwen2`` (q/k/v biases, optional sliding-window layers) and
``mistral`` (optional sliding window). Both the transformers-5 ``rope_parameters`` form
and the older ``rope_theta`` + ``rope_scaling`` form are understood.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedModelError(ValueError):
    """The checkpoint's config describes a model this runtime cannot serve."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters.

    ``rope_type`` is ``"default"`` or ``"llama3"``; ``scaling`` holds the llama3 keys
    (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
    """

    theta: float = 10000.0
    rope_type: str = "default"
    scaling: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LlamaFamilyConfig:
    """Hyper-parameters of a Llama-family decoder (global, i.e. before any sharding)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    # One entry per layer: the sliding-window size of that layer, or None (full causal).
    sliding_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if len(self.sliding_windows) != self.num_hidden_layers:
            raise ValueError(
                f"sliding_windows has {len(self.sliding_windows)} entries, expected "
                f"num_hidden_layers={self.num_hidden_layers}"
            )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaFamilyConfig:
        """Parse a Hugging Face ``config.json`` dictionary; raise on unsupported features."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"unsupported model_type={model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"unsupported hidden_act={act!r}; only 'silu' (SwiGLU) is supported")
        heads = _required(raw, "num_attention_heads")
        hidden = _required(raw, "hidden_size")
        layers = _required(raw, "num_hidden_layers")
        return cls(
            model_type=model_type,
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(raw, "intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            max_position_embeddings=_required(raw, "max_position_embeddings"),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=parse_rope(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            **_bias_flags(model_type, raw),
            sliding_windows=_sliding_windows(model_type, raw, layers),
        )


def _required(raw: dict[str, Any], key: str) -> Any:
    if raw.get(key) is None:
        raise UnsupportedModelError(f"config.json is missing required field {key!r}")
    return raw[key]


def _bias_flags(model_type: str, raw: dict[str, Any]) -> dict[str, bool]:
    if model_type == "qwen2":
        return {"qkv_bias": True, "o_bias": False, "mlp_bias": False}
    if model_type == "llama":
        attn = bool(raw.get("attention_bias", False))
        return {"qkv_bias": attn, "o_bias": attn, "mlp_bias": bool(raw.get("mlp_bias", False))}
    return {"qkv_bias": False, "o_bias": False, "mlp_bias": False}


def parse_rope(raw: dict[str, Any]) -> RopeConfig:
    """Read RoPE settings from either ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling``."""
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
    elif any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModelError("per-layer-type rope_parameters are not supported")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"unsupported rope_type={rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModelError(f"unsupported partial_rotary_factor={partial!r}; only 1.0")
    scaling: dict[str, float] = {}
    if rope_type == "llama3":
        missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
        if missing:
            raise UnsupportedModelError(f"rope_type='llama3' requires {missing} in the rope parameters")
        scaling = {k: float(params[k]) for k in _LLAMA3_KEYS}
    return RopeConfig(theta=theta, rope_type=rope_type, scaling=scaling)


def _sliding_windows(model_type: str, raw: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window (None = full causal attention), following each family's rules."""
    if model_type == "llama":
        return (None,) * layers
    window = raw.get("sliding_window")
    if model_type == "qwen2" and not raw.get("use_sliding_window", False):
        window = None
    if window is not None and (not isinstance(window, int) or window < 1):
        raise UnsupportedModelError(f"sliding_window={window!r} must be a positive integer or null")
    layer_types = raw.get("layer_types")
    if layer_types is None:
        if model_type == "qwen2":
            first = raw.get("max_window_layers", layers)
            layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        else:
            layer_types = ["sliding_attention"] * layers
    if len(layer_types) != layers or any(t not in _LAYER_TYPES for t in layer_types):
        raise UnsupportedModelError(
            f"layer_types={layer_types!r} must list {layers} entries from {_LAYER_TYPES}"
        )
    return tuple(window if t == "sliding_attention" else None for t in layer_types)
