"""Phi-3: fused projections split into the Llama layout; what the own runtime lacks is refused (-> fallback)."""

from __future__ import annotations

import pytest
import torch

from specdec.models import LlamaFamilyConfig, UnsupportedModelError
from specdec.models.families import convert_weights


def _raw(**changes) -> dict:
    raw = dict(model_type="phi3", vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=8)
    return {**raw, **changes}


def test_fused_qkv_and_gate_up_split_into_row_blocks_in_order():
    config = LlamaFamilyConfig.from_dict(_raw())
    assert config.sliding_windows == (8,) and config.head_dim == 4
    qkv = torch.arange((16 + 2 * 8) * 16, dtype=torch.float32).view(32, 16)  # q: 4 heads x 4, k and v: 2 x 4
    gate_up = torch.arange(48 * 16, dtype=torch.float32).view(48, 16)
    norm = torch.ones(16)
    weights = convert_weights(config, {"model.layers.0.self_attn.qkv_proj.weight": qkv,
                                       "model.layers.0.mlp.gate_up_proj.weight": gate_up,
                                       "model.layers.0.input_layernorm.weight": norm})
    layer = "model.layers.0."
    assert torch.equal(weights[layer + "self_attn.q_proj.weight"], qkv[:16])
    assert torch.equal(weights[layer + "self_attn.k_proj.weight"], qkv[16:24])
    assert torch.equal(weights[layer + "self_attn.v_proj.weight"], qkv[24:])
    assert torch.equal(weights[layer + "mlp.gate_proj.weight"], gate_up[:24])
    assert torch.equal(weights[layer + "mlp.up_proj.weight"], gate_up[24:])
    assert weights[layer + "input_layernorm.weight"] is norm
    assert not any("qkv_proj" in name or "gate_up_proj" in name for name in weights)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 2, "long_factor": [2.0] * 2}},
         "rope_type='longrope'"),
        ({"partial_rotary_factor": 0.75}, "partial_rotary_factor=0.75"),
    ],
)
def test_long_and_partial_rope_are_refused(changes, message):
    with pytest.raises(UnsupportedModelError, match=message):
        LlamaFamilyConfig.from_dict(_raw(**changes))
