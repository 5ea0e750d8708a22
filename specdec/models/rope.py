"""Rotary position embeddings (RoPE), "default", "linear" and "llama3" frequency schedules.

Uses the half-split layout of Hugging Face Llama checkpoints: the first and second
halves of each head dimension form the (real, imaginary) pairs.
"""

from __future__ import annotations

import math

import torch

from specdec.models.config import RopeConfig


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Return the RoPE inverse frequencies, float32 on CPU.  # [head_dim // 2]"""
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim={head_dim} must be even for rotary embeddings")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)  # [head_dim // 2]
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope.scaling)
    if rope.rope_type == "linear":  # positions divided by factor, i.e. every frequency
        return inv_freq / rope.scaling["factor"]
    if rope.rope_type != "default":
        raise ValueError(f"unsupported rope_type={rope.rope_type!r}")
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, scaling: dict[str, float]) -> torch.Tensor:
    """Llama 3.1 schedule: keep high frequencies, divide low ones by ``factor``, blend in between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original_len = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original_len / low
    high_freq_wavelength = original_len / high
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return torch.where(is_mid, blended, scaled)


class RotaryEmbedding:
    """Computes cos/sin tables for arbitrary per-token positions.

    Deliberately not an ``nn.Module`` buffer: the frequencies stay float32 whatever
    dtype the model is cast to, and are copied once per device.
    """

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        self.head_dim = head_dim
        self._inv_freq_cpu = inverse_frequencies(head_dim, rope)  # [head_dim // 2]
        self._per_device: dict[torch.device, torch.Tensor] = {}

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._per_device:
            self._per_device[device] = self._inv_freq_cpu.to(device)
        return self._per_device[device]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (cos, sin), each [batch, seq, head_dim], for ``positions`` [batch, seq]."""
        assert positions.dim() == 2, f"positions must be [batch, seq], got {tuple(positions.shape)}"
        inv_freq = self._inv_freq(positions.device)
        freqs = positions.to(torch.float32)[..., None] * inv_freq  # [batch, seq, head_dim // 2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [batch, seq, head_dim]
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [batch, seq, heads, head_dim] by per-token angles (cos/sin [batch, seq, head_dim])."""
    assert x.dim() == 4 and cos.shape == x.shape[:2] + x.shape[3:], (
        f"x {tuple(x.shape)} and cos {tuple(cos.shape)} do not match"
    )
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [batch, seq, 1, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
