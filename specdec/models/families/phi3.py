"""Phi-3: the Llama layout with fused projections. ``qkv_proj`` stacks q, k and v (in that order) and
``gate_up_proj`` stacks gate and up; the loader splits them into the separate projections, so the
decoder and tensor parallelism see an ordinary Llama checkpoint. An optional sliding window applies
to every layer. LongRoPE (the 128k variants) and partial rotary (Phi-4-mini) are refused here, so those
checkpoints go to the transformers runner.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from specdec.models.config import LlamaFamilyConfig, check_activation, common_fields, sliding_windows

_FUSED = re.compile(r"^(model\.layers\.\d+\.)(self_attn\.qkv_proj|mlp\.gate_up_proj)\.weight$")


def parse(raw: dict[str, Any]) -> LlamaFamilyConfig:
    """config.json of a phi3 checkpoint -> its serving config."""
    check_activation(raw, "hidden_act", "silu", ("silu",))
    return LlamaFamilyConfig(**common_fields(raw), sliding_windows=sliding_windows(raw, raw.get("sliding_window")))


def split_fused_weights(config: LlamaFamilyConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace each fused ``qkv_proj`` / ``gate_up_proj`` weight by its q/k/v or gate/up parts (row blocks)."""
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    split: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        match = _FUSED.match(name)
        if match is None:
            split[name] = tensor
            continue
        prefix, fused = match.groups()
        if fused == "self_attn.qkv_proj":
            parts = zip(("q_proj", "k_proj", "v_proj"), tensor.split([q_rows, kv_rows, kv_rows]))
            split.update({f"{prefix}self_attn.{p}.weight": w for p, w in parts})
        else:
            gate, up = tensor.chunk(2)
            split[f"{prefix}mlp.gate_proj.weight"], split[f"{prefix}mlp.up_proj.weight"] = gate, up
    return split
