"""Gumbel-max sampling with noise addressed by (seed, position, token): the coupled sampler.

A seeded sampled request decides the token at history position t as

    argmax_v  log p_t(v) + G(seed, t, v)        (p_t(v) > 0 only)

where G(seed, t, v) = -log(-log u) is standard Gumbel noise and u = token_uniforms(seed,
t, V)[v] (`specdec.sampling.counter_rng`, role ROLE_GUMBEL). By the Gumbel-max trick the token
follows p_t exactly. The draft decides its guess at t with the *same* noise over its own
q_t, and a drafted token is accepted iff it equals the target's choice
(`specdec.sampling.rejection_sampler`): every emitted token is then this function of p_t and
(seed, t) alone, whatever was drafted or whether anything was (drafter-invariant
speculative decoding; Daliri, Musco and Suresh, "Coupling without Communication and
Drafter-Invariant Speculative Decoding", 2024). The two choices disagree with probability
at most 2 TV(p, q) / (1 + TV(p, q)).

Numerics (float64): the argmax is computed as the exponential race argmax_v p(v) / E_v
with E_v = -log(1 - u_v) (the same order as log p + G, one division instead of two
logarithms). u = 0 (probability 2**-53) would make E_v = 0; it stands for its grid cell
[0, 2**-53) and is given that cell's midpoint, E = 2**-54. Tokens of probability 0 score 0
and are never chosen while any token has mass; ties go to the lowest token id.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specdec.sampling.counter_rng import token_uniforms

_SMALLEST_EXPONENTIAL = 2.0**-54  # E for u = 0: the midpoint of its grid cell


def exponential_noise(seeds: np.ndarray, positions: np.ndarray, vocab: int) -> np.ndarray:
    """E(seed, t, v) = -log(1 - u) > 0, float64 [*positions.shape, V] (see the module doc).

    seeds: [B] uint64; positions: [B] or [B, n] int64 (row b uses seeds[b])."""
    noise = -np.log1p(-token_uniforms(seeds, positions, vocab))  # [..., V]
    return np.maximum(noise, _SMALLEST_EXPONENTIAL, out=noise)


def gumbel_argmax(probs: Tensor, seeds: np.ndarray, positions: Tensor) -> Tensor:
    """The Gumbel-max token of each distribution, under the noise of its (seed, position).

    probs: [B, V] or [B, n, V] non-negative weights (unnormalised is fine: the argmax does
    not depend on the scale); seeds: [B] uint64; positions: [B] or [B, n] int64, the
    history position each distribution decides. Returns int64 tokens shaped like positions.
    """
    return race(probs, seeds, positions).argmax(dim=-1)


def race(probs: Tensor, seeds: np.ndarray, positions: Tensor) -> Tensor:
    """Each token's score p(v) / E(seed, t, v), float64 shaped like probs (gumbel_argmax's
    arguments): the Gumbel-max token scores highest, and the order of the others ranks
    which token a distribution near this one would choose under the same noise."""
    assert probs.dim() == positions.dim() + 1 and probs.shape[:-1] == positions.shape, (
        f"need probs [B, (n,) V] and positions [B, (n)], got {tuple(probs.shape)}, {tuple(positions.shape)}"
    )
    weights = probs.double()
    if not bool(((weights > 0).any(dim=-1) & torch.isfinite(weights).all(dim=-1)).all()):
        raise ValueError("cannot sample from a distribution without finite, positive probability mass")
    noise = exponential_noise(seeds, positions.cpu().numpy(), probs.shape[-1])  # [..., V]
    return weights / torch.from_numpy(noise).to(weights.device)  # [..., V]; p = 0 scores 0
