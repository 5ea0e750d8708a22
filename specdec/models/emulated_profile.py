"""Latency profiles of emulated devices: the files under configs/devices/ and their arithmetic.

A profile describes one deployment: the target (on its own device, or a tensor-parallel
group of them) and the draft (on a device of its own), each with a `LatencyModel` fitted to
public measurements or measured by `specdec profile`, and the synthetic language both
models speak (`LanguageSpec`: vocabulary, acceptance rate, how it varies). Models name a
profile as ``emulated:<profile>:<role>``: the profile is a file name under configs/devices
(without .yaml) or a path to a .yaml file, the role is ``target`` or ``draft``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

EMULATED_PREFIX = "emulated:"
ROLES = ("target", "draft")
DEVICES_DIR = Path(__file__).resolve().parents[2] / "configs" / "devices"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyModel(_Strict):
    """Time of one forward of a batch on its device (a roofline with an attention term):

        ms = base_ms + per_row_ms * rows + per_token_ms * max(0, tokens - knee_tokens)
             + per_context_token_ms * context_tokens

    flat while the forward is memory-bound (weights read once, whatever the batch) and rising
    past the compute-bound knee; attention reads every attended K/V entry."""

    base_ms: float = Field(ge=0, description="A forward of one token: reading the weights (memory-bound floor).")
    per_row_ms: float = Field(0.0, ge=0, description="Each row (sequence) of the batch: per-row kernels, sampling.")
    knee_tokens: float = Field(ge=0, description="Tokens per forward (all rows) below which it stays memory-bound.")
    per_token_ms: float = Field(ge=0, description="Past the knee: each further token of the forward (compute-bound).")
    per_context_token_ms: float = Field(
        0.0, ge=0, description="Each context token attended, summed over the rows (K/V cache reads).")

    def forward_ms(self, rows: int, tokens: int, context_tokens: int) -> float:
        """Milliseconds of one forward of `rows` rows, `tokens` new tokens in all, attending
        `context_tokens` cached + new tokens in all."""
        return (self.base_ms + self.per_row_ms * rows + self.per_token_ms * max(0.0, tokens - self.knee_tokens)
                + self.per_context_token_ms * context_tokens)


class DeviceModel(_Strict):
    """One emulated model: what it stands for, its shape (for tensor-parallel checks) and its latency."""

    name: str = Field(description="What the model and device stand for, e.g. 'Llama-3.1-8B, bf16, 1x H100 SXM'.")
    tensor_parallel_size: int = Field(1, ge=1, description="Ranks the latency was fitted at (each rank one device).")
    num_attention_heads: int = Field(32, ge=1, description="Query heads of the model stood for (TP divisibility).")
    num_key_value_heads: int = Field(8, ge=1, description="K/V heads of the model stood for (TP divisibility).")
    intermediate_size: int = Field(8192, ge=1, description="MLP width of the model stood for (TP divisibility).")
    max_position_embeddings: int = Field(8192, ge=2, description="Longest context the emulated model accepts.")
    latency: LatencyModel = Field(description="Forward time on this device (for the whole group at TP > 1).")


class LanguageSpec(_Strict):
    """The synthetic language: its vocabulary and how often the draft guesses the target's token."""

    vocab_size: int = Field(512, ge=258, le=4096, description="Tokens (a prefix of the bundled byte-level BPE).")
    seed: int = Field(0, ge=0, description="Seeds every table of the language (same seed, same logits).")
    context_tokens: int = Field(3, ge=1, le=16, description="n of the n-gram context a distribution depends on.")
    support: int = Field(16, ge=1, le=128, description="Tokens with non-negligible probability in a context.")
    acceptance: float = Field(0.7, ge=0, le=1, description="α: mean per-token acceptance of the draft's guesses.")
    acceptance_spread: float = Field(
        0.5, ge=0, le=1, description="How far easy and hard stretches lie from α (0 = every stretch at α).")
    stretch_tokens: int = Field(16, ge=1, description="Length of a stretch of text sharing one difficulty.")
    miss_ranks: tuple[float, ...] = Field(
        (0.42, 0.16, 0.09), max_length=8, description="Where the draft misses (its top choice is not the target's "
        "argmax): how often the target's argmax is its 2nd, 3rd, ... choice (the rest: not among its top few).")

    @model_validator(mode="after")
    def _fits(self) -> LanguageSpec:
        if 2 * self.support > self.vocab_size - 1:
            raise ValueError(f"support ({self.support}) must be at most (vocab_size - 1) / 2")
        if any(not 0 <= share <= 1 for share in self.miss_ranks) or sum(self.miss_ranks) > 1 + 1e-9:
            raise ValueError(f"miss_ranks {self.miss_ranks} must be shares in [0, 1] summing to at most 1")
        if len(self.miss_ranks) >= self.support:
            raise ValueError(f"miss_ranks ranks the target's token up to {len(self.miss_ranks) + 1}: "
                             f"support ({self.support}) must be larger")
        return self


class DeviceProfile(_Strict):
    """A profile file: the deployment it stands for, the public sources, its two models."""

    description: str = Field("", description="The deployment this profile stands for and how it was fitted.")
    sources: list[str] = Field(default_factory=list, description="Where the fitted figures come from (URLs).")
    time_scale: float = Field(1.0, gt=0, description="Multiplies every device time of this profile.")
    language: LanguageSpec = Field(default_factory=LanguageSpec, description="The synthetic language.")
    target: DeviceModel = Field(description="The target model and its device(s).")
    draft: DeviceModel = Field(description="The draft model and its device.")

    def model(self, role: str) -> DeviceModel:
        return self.target if role == "target" else self.draft


@dataclass(frozen=True)
class EmulatedName:
    """A parsed 'emulated:<profile>:<role>'."""

    profile: str
    role: Literal["target", "draft"]


def is_emulated(name: str) -> bool:
    return isinstance(name, str) and name.startswith(EMULATED_PREFIX)


def parse_emulated_name(name: str) -> EmulatedName:
    """'emulated:h100-llama-8b-1b:target' -> EmulatedName; ValueError on any other shape."""
    body = name[len(EMULATED_PREFIX):] if is_emulated(name) else ""
    profile, _, role = body.rpartition(":")
    if not profile or role not in ROLES:
        raise ValueError(f"emulated model {name!r} must look like 'emulated:<profile>:target' or "
                         f"'emulated:<profile>:draft'")
    return EmulatedName(profile, role)  # type: ignore[arg-type]


def profile_path(profile: str) -> Path:
    """A profile name under configs/devices, or a path to a .yaml file."""
    if profile.endswith((".yaml", ".yml")):
        return Path(profile).expanduser()
    return DEVICES_DIR / f"{profile}.yaml"


def load_profile(profile: str) -> DeviceProfile:
    """Read and validate a profile; ValueError names the file and the problem."""
    path = profile_path(profile)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        known = ", ".join(sorted(p.stem for p in DEVICES_DIR.glob("*.yaml")))
        raise ValueError(f"no device profile {profile!r} ({path}: {exc.strerror or exc}); shipped: {known}") from None
    try:
        return DeviceProfile.model_validate(data or {})
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        key = ".".join(str(part) for part in error["loc"])
        raise ValueError(f"device profile {path}: {key}: {error['msg']}") from None


def write_profile(profile: DeviceProfile, path: Path, header: str = "") -> None:
    """Write `profile` as YAML (a comment `header` first), in the shape load_profile reads."""
    text = yaml.safe_dump(profile.model_dump(), sort_keys=False)
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    Path(path).write_text(comment + text)
