"""Which runner serves a checkpoint: the own runtime (``ModelRunner``) for the families it implements,
else the transformers fallback (``TransformersRunner``); start-up logs the choice and its reason
(a warning when a model falls back on its own)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

import torch

from specdec.models.config import UnsupportedModelError
from specdec.models.emulated_profile import is_emulated
from specdec.models.kv_cache import DEFAULT_BLOCK_SIZE
from specdec.models.loader import load_model, model_config, read_config, resolve_checkpoint_dir
from specdec.models.model_runner import ModelRunner
from specdec.models.transformers_runner import TransformersRunner

logger = logging.getLogger(__name__)

RunnerChoice = Literal["auto", "specdec", "transformers"]
SPECDEC, TRANSFORMERS = ModelRunner.runner_kind, TransformersRunner.runner_kind


def choose_runner(checkpoint_dir: Path, choice: RunnerChoice = "auto") -> tuple[str, str]:
    """(runner kind, reason) for the checkpoint: 'auto' takes the own runtime when it implements the
    config's model_type and features, else transformers; 'specdec' raises UnsupportedModelError then."""
    if choice == TRANSFORMERS:
        return TRANSFORMERS, "configured"
    try:
        read_config(checkpoint_dir)
    except UnsupportedModelError as error:
        if choice == SPECDEC:
            raise
        return TRANSFORMERS, f"the own runtime cannot serve it: {error}"
    return SPECDEC, "configured" if choice == SPECDEC else "the own runtime implements it"


def open_runner(
    name_or_path: str,
    num_slots: int,
    max_seq_len: int | None,
    dtype: str | torch.dtype = "float32",
    device: torch.device | str = "cpu",
    choice: RunnerChoice = "auto",
    time_scale: float = 1.0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    memory_budget: float | None = None,
    prefix_caching: bool = True,
    kv_tokens: int | None = None,
) -> ModelRunner | TransformersRunner:
    """Load ``name_or_path`` (local directory or hub id) into the runner ``choose_runner`` picks; an
    'emulated:<profile>:<role>' name runs on the own runtime (time_scale multiplies its device times).
    block_size, memory_budget (else kv_tokens) and prefix_caching set up the own runtime's paged cache; the
    fallback keeps per-slot caches whose reserves the budget bounds (no blocks, no prefix cache)."""
    budget = {"memory_budget": memory_budget, "kv_tokens": kv_tokens}
    paging = {"block_size": block_size, "prefix_caching": prefix_caching, **budget}
    if is_emulated(name_or_path):
        logger.info("model %s: %s runner (emulated device)", name_or_path, SPECDEC)
        return ModelRunner(load_model(name_or_path, time_scale=time_scale), num_slots, max_seq_len, **paging)
    checkpoint_dir = resolve_checkpoint_dir(name_or_path)
    kind, reason = choose_runner(checkpoint_dir, choice)
    if kind == TRANSFORMERS:
        runner = TransformersRunner.from_pretrained(str(checkpoint_dir), num_slots, max_seq_len, dtype, device,
                                                    **budget)
    else:
        runner = ModelRunner(load_model(str(checkpoint_dir), dtype=dtype, device=device), num_slots, max_seq_len,
                             **paging)
    # the fallback is slower, so an automatic fall back is a warning: visible at the CLI's default log level
    level = logging.WARNING if kind == TRANSFORMERS and choice == "auto" else logging.INFO
    logger.log(level, "model %s (model_type=%s): %s runner (%s); %s", name_or_path, model_type(checkpoint_dir), kind,
               reason, cache_summary(runner))
    return runner


def cache_summary(runner: ModelRunner | TransformersRunner) -> str:
    """What start-up says about a runner's cache: its sizing, and for the fallback that it is not paged."""
    blocks, size = runner.block_capacity
    if runner.runner_kind == TRANSFORMERS:
        counted = f"reserves against {blocks} tokens" if blocks else "slots"
        return (f"not paged: each of its {runner.cache.num_slots} slots may grow to max_seq_len={runner.max_seq_len} "
                f"as tokens arrive, admission counts {counted} (block_size and prefix_caching do not apply)")
    return (f"paged KV cache: {blocks} blocks of {size} tokens ({blocks * size} tokens), "
            f"max_seq_len={runner.max_seq_len}, at most {runner.cache.num_slots} sequences at once")


def _raw_config(checkpoint_dir: Path) -> dict:
    path = checkpoint_dir / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def model_type(checkpoint_dir: Path) -> str | None:
    """The ``model_type`` of the checkpoint's config.json (None without one)."""
    return _raw_config(checkpoint_dir).get("model_type")


def vocab_size_of(name_or_path: str) -> int:
    """The vocabulary size of a checkpoint or an emulated model, whichever runner serves it; no weights are read."""
    if is_emulated(name_or_path):
        return model_config(name_or_path).vocab_size
    return config_vocab_size(resolve_checkpoint_dir(name_or_path))


def config_vocab_size(checkpoint_dir: Path) -> int:
    """The vocabulary size of the checkpoint's config.json (its text model's, for a multimodal config),
    whichever runner serves it; no weights are read."""
    raw = _raw_config(checkpoint_dir)
    vocab = raw.get("vocab_size") or (raw.get("text_config") or {}).get("vocab_size")
    if not vocab:
        raise UnsupportedModelError(f"no vocab_size in the config.json of {str(checkpoint_dir)!r}")
    return int(vocab)
