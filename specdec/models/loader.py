"""Load a checkpoint of a family the own runtime implements, in Hugging Face format (config.json +
safetensors); ``specdec.models.families`` reads its config by ``model_type``.

Accepts a local directory or a hub id (resolved with ``huggingface_hub.snapshot_download``,
which honours ``HF_HUB_OFFLINE``). Weights are cast to the requested dtype tensor by
tensor; the module is built on the meta device first so no random initialisation runs.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open

from specdec.models.config import LlamaFamilyConfig
from specdec.models.families import convert_weights
from specdec.models.emulated_model import load_emulated_model
from specdec.models.emulated_profile import is_emulated
from specdec.models.llama import LlamaForServing

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
_INDEX_FILE = "model.safetensors.index.json"
_IGNORED_KEYS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", _INDEX_FILE]


class CheckpointError(ValueError):
    """The checkpoint's weights do not match the architecture its config describes."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map "float32" / "fp16" / "bf16" / torch.dtype to a torch floating dtype."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in _DTYPES:
        resolved = _DTYPES[dtype.lower().removeprefix("torch.")]
    else:
        raise ValueError(f"unsupported dtype={dtype!r}; use one of {sorted(set(_DTYPES))}")
    if resolved not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype={dtype!r}; must be float32, float16 or bfloat16")
    return resolved


def resolve_checkpoint_dir(name_or_path: str) -> Path:
    """Return a local directory for ``name_or_path``, downloading from the hub for ids like "org/name"."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint path {name_or_path!r} is not a directory")
        return path
    if os.path.isabs(name_or_path) or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1:
        raise FileNotFoundError(f"checkpoint directory {name_or_path!r} does not exist")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=name_or_path, allow_patterns=_HUB_PATTERNS))


def read_config(checkpoint_dir: Path) -> LlamaFamilyConfig:
    """Parse ``config.json`` of ``checkpoint_dir``."""
    config_path = checkpoint_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {str(checkpoint_dir)!r}")
    with config_path.open() as f:
        return LlamaFamilyConfig.from_dict(json.load(f))


def model_config(name_or_path: str) -> LlamaFamilyConfig:
    """A model's config without loading its weights: config.json of its checkpoint, or the
    shape an emulated model ('emulated:<profile>:<role>') stands for."""
    if is_emulated(name_or_path):
        return load_emulated_model(name_or_path, time_scale=0.0).config  # type: ignore[return-value]
    return read_config(resolve_checkpoint_dir(name_or_path))


def safetensors_files(checkpoint_dir: Path) -> list[Path]:
    """The weight files: those named by the sharded index if present, else every *.safetensors."""
    index_path = checkpoint_dir / _INDEX_FILE
    if index_path.is_file():
        with index_path.open() as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        files = [checkpoint_dir / n for n in names]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{_INDEX_FILE} lists missing shard files: {missing}")
        return files
    files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors weights in {str(checkpoint_dir)!r} (pytorch_model.bin is not supported)"
        )
    return files


def read_weights(files: list[Path], dtype: torch.dtype, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Load every tensor of ``files``, cast to ``dtype`` on ``device``."""
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return weights


def assign_weights(model: LlamaForServing, weights: dict[str, torch.Tensor]) -> None:
    """Install ``weights`` into a meta-device ``model``; raise CheckpointError on missing/unexpected keys."""
    expected = set(model.state_dict().keys())
    tied = model.config.tie_word_embeddings
    if tied:
        expected.discard("lm_head.weight")
        weights.pop("lm_head.weight", None)
    provided = {k for k in weights if not _IGNORED_KEYS.search(k)}
    missing, unexpected = sorted(expected - provided), sorted(provided - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint does not match model_type={model.config.model_type!r}: "
            f"missing={missing[:8]} unexpected={unexpected[:8]}"
        )
    model.load_state_dict({k: weights[k] for k in expected}, strict=False, assign=True)
    if tied:
        model.tie_weights()


def load_model(
    name_or_path: str, dtype: str | torch.dtype = "float32", device: torch.device | str = "cpu",
    time_scale: float = 1.0,
) -> LlamaForServing:
    """Build a :class:`LlamaForServing` from a HF-format checkpoint directory or hub id, in eval mode.

    An 'emulated:<profile>:<role>' name builds an EmulatedModel instead (no weights; dtype and
    device do not apply; time_scale multiplies its device times)."""
    if is_emulated(name_or_path):
        return load_emulated_model(name_or_path, time_scale)  # type: ignore[return-value]
    torch_dtype = resolve_dtype(dtype)
    checkpoint_dir = resolve_checkpoint_dir(name_or_path)
    config = read_config(checkpoint_dir)
    weights = convert_weights(config, read_weights(safetensors_files(checkpoint_dir), torch_dtype, device))
    with torch.device("meta"):
        model = LlamaForServing(config)
    assign_weights(model, weights)
    leftover = [n for n, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise CheckpointError(f"parameters left uninitialised after loading: {leftover[:8]}")
    model.requires_grad_(False)
    return model.eval()
