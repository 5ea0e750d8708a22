"""Reading Qwen3 configs: q/k norms on, head_dim independent of hidden_size / heads, Qwen's sliding-window rule."""

from __future__ import annotations

from specdec.models import LlamaFamilyConfig


def _raw(**changes) -> dict:
    raw = dict(model_type="qwen3", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return {**raw, **changes}


def test_qwen3_has_qk_norms_and_transformers_default_head_dim():
    config = LlamaFamilyConfig.from_dict(_raw())
    assert config.qk_norm and config.head_dim == 128  # Qwen3Config's default, not hidden_size / heads
    assert not (config.qkv_bias or config.o_bias or config.mlp_bias or config.unit_offset_norm)


def test_qwen3_attention_bias_covers_every_attention_projection():
    config = LlamaFamilyConfig.from_dict(_raw(head_dim=8, attention_bias=True))
    assert (config.head_dim, config.qkv_bias, config.o_bias, config.mlp_bias) == (8, True, True, False)


def test_qwen3_slides_from_max_window_layers_only_when_enabled():
    raw = _raw(sliding_window=4, max_window_layers=1)
    assert LlamaFamilyConfig.from_dict(raw).sliding_windows == (None, None, None)
    assert LlamaFamilyConfig.from_dict({**raw, "use_sliding_window": True}).sliding_windows == (None, 4, 4)
