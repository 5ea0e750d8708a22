"""The model families the own runtime serves: each module reads its family's ``config.json`` into a
:class:`~specdec.models.config.LlamaFamilyConfig` (the switches its layers need) and, where its
checkpoint's layout differs from the decoder's (Phi-3's fused projections), converts the weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdec.models.config import LlamaFamilyConfig, UnsupportedModelError
import torch

from specdec.models.families import gemma, llama, phi3, qwen3

# model_type -> the parser of its config.json
PARSERS: dict[str, Callable[[dict[str, Any]], LlamaFamilyConfig]] = {
    "llama": llama.parse,
    "qwen2": llama.parse,
    "mistral": llama.parse,
    "qwen3": qwen3.parse,
    "gemma2": gemma.parse_gemma2,
    "gemma3_text": gemma.parse_gemma3,
    "phi3": phi3.parse,
}
SUPPORTED_MODEL_TYPES = tuple(PARSERS)
# model_type -> how its checkpoint's weights become the decoder's (fused projections split)
WEIGHT_CONVERTERS: dict[str, Callable[[LlamaFamilyConfig, dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "phi3": phi3.split_fused_weights,
}


def parse_config(raw: dict[str, Any]) -> LlamaFamilyConfig:
    """Parse a Hugging Face ``config.json`` dictionary; raise UnsupportedModelError for another model_type
    or a feature the own runtime lacks."""
    model_type = raw.get("model_type")
    if model_type not in PARSERS:
        raise UnsupportedModelError(
            f"unsupported model_type={model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return PARSERS[model_type](raw)


def convert_weights(config: LlamaFamilyConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's ``weights`` named and shaped as the decoder's parameters (most families: as they are)."""
    converter = WEIGHT_CONVERTERS.get(config.model_type)
    return weights if converter is None else converter(config, weights)
