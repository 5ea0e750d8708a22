"""Serving model runtime for Hugging Face checkpoints: the own runtime for the Llama family (Llama, Qwen2,
Qwen3, Mistral, Gemma 2/3, Phi-3), the transformers fallback for any other causal LM (``runners.open_runner``)."""

from specdec.models.config import LlamaFamilyConfig, RopeConfig, UnsupportedModelError
from specdec.models.kv_cache import CacheFullError, InvalidSlotError, KVCache
from specdec.models.llama import LlamaForServing
from specdec.models.loader import CheckpointError, load_model
from specdec.models.model_runner import ModelRunner
from specdec.models.runners import open_runner
from specdec.models.tensor_parallel import RowParallelLinear, shard_model
from specdec.models.transformers_runner import TransformersRunner

__all__ = [
    "CacheFullError",
    "CheckpointError",
    "InvalidSlotError",
    "KVCache",
    "LlamaFamilyConfig",
    "LlamaForServing",
    "ModelRunner",
    "RopeConfig",
    "RowParallelLinear",
    "TransformersRunner",
    "UnsupportedModelError",
    "load_model",
    "open_runner",
    "shard_model",
]
