"""Serving model runtime for Llama-family checkpoints (Llama, Qwen2, Mistral) in Hugging Face format."""

from specdec.models.config import LlamaFamilyConfig, RopeConfig, UnsupportedModelError
from specdec.models.kv_cache import CacheFullError, InvalidSlotError, KVCache
from specdec.models.llama import LlamaForServing
from specdec.models.loader import CheckpointError, load_model
from specdec.models.model_runner import ModelRunner
from specdec.models.tensor_parallel import RowParallelLinear, shard_model

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
    "UnsupportedModelError",
    "load_model",
    "shard_model",
]
