"""Architecture description of a decoder checkpoint the own runtime serves, parsed from its ``config.json``.

Only what the serving model needs is kept: the Llama layout plus the switches later
families add (q/k norms, Gemma's norms, activation, scales and soft-capping, per-layer
RoPE). Each family's rules for reading its config live in ``specdec.models.families``;
the shared readers are here. Both the transformers-5 ``rope_parameters`` form and the
older ``rope_theta`` + ``rope_scaling`` form are understood.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedModelError(ValueError):
    """The checkpoint's config describes a model this runtime cannot serve."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters.

    ``rope_type`` is ``"default"``, ``"linear"`` or ``"llama3"``; ``scaling`` holds the linear
    ``factor`` or the llama3 keys (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
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
    hidden_act: str = "silu"  # MLP gate activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma)
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma 3)
    unit_offset_norm: bool = False  # RMSNorms scale by (1 + weight), all in float32 (Gemma)
    sandwich_norms: bool = False  # norms after attention and around the MLP as well (Gemma 2/3)
    embed_scale: float | None = None  # embeddings multiplied by this, in the model dtype (Gemma: sqrt(hidden))
    query_scale: float | None = None  # attention score scale; None = head_dim ** -0.5
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    sliding_rope: RopeConfig | None = None  # RoPE of the sliding-window layers when it differs (Gemma 3)

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
        """Parse a Hugging Face ``config.json`` dictionary with its family's rules; raise on unsupported features."""
        from specdec.models.families import parse_config  # the families build on this module

        return parse_config(raw)


def required(raw: dict[str, Any], key: str) -> Any:
    """``raw[key]``, raising UnsupportedModelError when it is absent or null."""
    if raw.get(key) is None:
        raise UnsupportedModelError(f"config.json is missing required field {key!r}")
    return raw[key]


def common_fields(raw: dict[str, Any], rope: RopeConfig | None = None) -> dict[str, Any]:
    """The fields every family reads the same way (sizes, heads, eps, tied embeddings, RoPE unless given)."""
    heads = required(raw, "num_attention_heads")
    hidden = required(raw, "hidden_size")
    return dict(
        model_type=raw["model_type"],
        vocab_size=required(raw, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=required(raw, "intermediate_size"),
        num_hidden_layers=required(raw, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        max_position_embeddings=required(raw, "max_position_embeddings"),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=rope or parse_rope(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


def check_activation(raw: dict[str, Any], key: str, default: str, supported: tuple[str, ...]) -> str:
    """The MLP activation named by ``raw[key]`` (or ``default``), refused unless in ``supported``."""
    act = raw.get(key) or default
    if act not in supported:
        raise UnsupportedModelError(f"unsupported {key}={act!r}; supported: {', '.join(supported)}")
    return act


def parse_rope(raw: dict[str, Any], params: dict[str, Any] | None = None) -> RopeConfig:
    """Read RoPE settings from ``params`` if given, else ``rope_parameters`` (transformers 5) or
    ``rope_theta``/``rope_scaling`` (older configs)."""
    if params is None:
        params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
    elif any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModelError("per-layer-type rope_parameters are not supported for this model_type")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"unsupported rope_type={rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModelError(f"unsupported partial_rotary_factor={partial!r}; only 1.0")
    keys = {"llama3": _LLAMA3_KEYS, "linear": ("factor",)}.get(rope_type, ())
    missing = [k for k in keys if params.get(k) is None]
    if missing:
        raise UnsupportedModelError(f"rope_type={rope_type!r} requires {missing} in the rope parameters")
    return RopeConfig(theta=theta, rope_type=rope_type, scaling={k: float(params[k]) for k in keys})


def sliding_windows(
    raw: dict[str, Any], window: int | None, default_layer_types: list[str] | None = None
) -> tuple[int | None, ...]:
    """Per-layer sliding window (None = full causal attention): ``window`` on the layers that ``layer_types``
    (else the family's ``default_layer_types``, else every layer) marks sliding; None everywhere without a window."""
    layers = required(raw, "num_hidden_layers")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise UnsupportedModelError(f"sliding_window={window!r} must be a positive integer or null")
    layer_types = raw.get("layer_types") or default_layer_types or ["sliding_attention"] * layers
    if len(layer_types) != layers or any(t not in _LAYER_TYPES for t in layer_types):
        raise UnsupportedModelError(
            f"layer_types={layer_types!r} must list {layers} entries from {_LAYER_TYPES}"
        )
    return tuple(window if t == "sliding_attention" else None for t in layer_types)
