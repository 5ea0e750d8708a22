"""Tiny random Hugging Face checkpoints (saved with ``save_pretrained``) shared by the model tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

_BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
)

# family name -> (transformers config class name, overrides of _BASE)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    "llama_biased": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "llama3_rope_tied": (
        "LlamaConfig",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
            },
        },
    ),
    "qwen2": ("Qwen2Config", {}),
    "qwen2_sliding_tied": (
        "Qwen2Config",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "tie_word_embeddings": True},
    ),
    "mistral": ("MistralConfig", {"sliding_window": 5, "head_dim": 32}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
    "qwen3_sliding_biased": (
        "Qwen3Config",
        {"head_dim": 16, "attention_bias": True, "use_sliding_window": True, "sliding_window": 4,
         "max_window_layers": 1},
    ),
    # soft-caps small enough to bite on random weights; query_pre_attn_scalar != head_dim
    "gemma2": (
        "Gemma2Config",
        {"head_dim": 16, "sliding_window": 4, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 1.5,
         "final_logit_softcapping": 2.0},
    ),
    "phi3": ("Phi3Config", {"sliding_window": 5, "pad_token_id": 0, "eos_token_id": 1}),  # fused qkv / gate_up
    # what the own runtime does not implement (a model type; a feature): served by the transformers fallback
    "gpt2": ("GPT2Config", {"n_inner": 128, "bos_token_id": 1, "eos_token_id": 1}),
    "phi3_partial_rotary": ("Phi3Config", {"partial_rotary_factor": 0.5, "pad_token_id": 0, "eos_token_id": 1}),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 32, "sliding_window": 4, "query_pre_attn_scalar": 24, "final_logit_softcapping": 2.0,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0},
            },
        },
    ),
}


def build_hf_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A random transformers model of ``family``; norms and biases are randomised too (HF inits them trivially)."""
    import transformers

    class_name, overrides = FAMILIES[family]
    config = getattr(transformers, class_name)(**{**_BASE, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: ``tiny_checkpoint(family, dtype=torch.float32, shard_size=None)`` -> saved checkpoint dir (cached)."""
    cache: dict[tuple, Path] = {}

    def make(family: str, dtype: torch.dtype = torch.float32, shard_size: str | None = None) -> Path:
        key = (family, dtype, shard_size)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"{family}_{str(dtype).split('.')[-1]}")
            model = build_hf_model(family).to(dtype)
            kwargs = {"max_shard_size": shard_size} if shard_size else {}
            model.save_pretrained(path, **kwargs)
            cache[key] = path
        return cache[key]

    return make


@pytest.fixture(scope="session")
def reference_logits() -> Callable[[Path, list[int]], torch.Tensor]:
    """Factory: transformers float32 logits [len(tokens), vocab] of one token sequence, full forward, no cache.

    The transformers model is loaded from the checkpoint dir (eager attention) and cached.
    """
    models: dict[Path, torch.nn.Module] = {}

    def logits(path: Path, tokens: list[int]) -> torch.Tensor:
        if path not in models:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
            models[path] = model.eval()
        with torch.no_grad():
            return models[path](torch.tensor([tokens])).logits[0].float()

    return logits
