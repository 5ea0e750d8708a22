"""Reading Gemma 2 / Gemma 3 configs: transformers' family defaults fill missing keys, both RoPE forms
(per-layer-type ``rope_parameters`` and the older ``rope_theta`` + ``rope_local_base_freq``) are understood,
and what the runtime cannot serve is refused by name."""

from __future__ import annotations

import pytest

from specdec.models import LlamaFamilyConfig, UnsupportedModelError


def _raw(model_type: str, **changes) -> dict:
    raw = dict(model_type=model_type, vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
               num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    return {**raw, **changes}


def test_gemma2_defaults_cap_scores_and_logits_and_alternate_sliding_layers():
    config = LlamaFamilyConfig.from_dict(_raw("gemma2", sliding_window=16))
    assert (config.attn_softcap, config.final_softcap) == (50.0, 30.0)
    assert config.sliding_windows == (16, None) * 3
    assert config.tie_word_embeddings and config.unit_offset_norm and config.sandwich_norms
    assert config.embed_scale == 16**0.5 and config.query_scale == 256**-0.5
    assert config.hidden_act == "gelu_pytorch_tanh" and not config.qk_norm


def test_gemma3_legacy_config_reads_both_ropes_and_the_sliding_pattern():
    raw = _raw("gemma3_text", sliding_window=16, sliding_window_pattern=3, rope_theta=1e6,
               rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=8)
    config = LlamaFamilyConfig.from_dict(raw)
    assert config.sliding_windows == (16, 16, None) * 2
    assert (config.rope.theta, config.rope.rope_type, config.rope.scaling) == (1e6, "linear", {"factor": 8.0})
    assert (config.sliding_rope.theta, config.sliding_rope.rope_type) == (1e4, "default")
    assert config.qk_norm and config.attn_softcap is None and config.final_softcap is None
    assert config.query_scale == 8**-0.5


def test_gemma3_per_layer_type_rope_parameters():
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 2e3}}
    config = LlamaFamilyConfig.from_dict(_raw("gemma3_text", rope_parameters=rope))
    assert (config.rope.theta, config.sliding_rope.theta) == (5e5, 2e3)


@pytest.mark.parametrize(
    "model_type, changes, message",
    [
        ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma2", {"hidden_activation": "relu"}, "hidden_activation='relu'"),
        ("gemma2", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type='yarn'"),
        ("gemma2", {"layer_types": ["full_attention"]}, "layer_types="),
    ],
)
def test_what_the_runtime_cannot_serve_is_refused(model_type, changes, message):
    with pytest.raises(UnsupportedModelError, match=message):
        LlamaFamilyConfig.from_dict(_raw(model_type, **changes))
