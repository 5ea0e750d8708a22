"""P(first k drafted tokens accepted): the acceptance curves the goodput plan prices γ with.

The cluster's curve is measured per position (`LoadSnapshot.alpha_per_position`) and
continued past the last measured position at its last conditional rate; a row's own curve
is the cluster's, scaled by how the row's accepted tokens compare with what the cluster's
acceptance expected of its drafts, shrunk towards the cluster's while the row has drafted
little (`specdec.policy.gamma` states the objective these curves feed).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def expected_tokens(alpha: float, gamma: int) -> float:
    """Mean tokens a round emits (accepted + the recovered/bonus token) when each drafted
    token is accepted independently with probability α (Leviathan et al., 2023):
    (1 − α^(γ+1)) / (1 − α), γ + 1 when α = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def extend_prefix_acceptance(prefix: tuple[float, ...], length: int) -> np.ndarray:
    """P(first k accepted) for k = 1 … length: the measured positions, then the last measured
    conditional rate P(k | k − 1) onwards. # [length]"""
    if not prefix:
        raise ValueError("prefix acceptance must not be empty")
    probs = np.clip(np.asarray(prefix[:length], dtype=np.float64), 0.0, 1.0)
    if len(probs) >= length:
        return probs
    previous = probs[-2] if len(probs) > 1 else 1.0
    tail = min(1.0, probs[-1] / previous) if previous > 0 else 0.0
    extra = probs[-1] * tail ** np.arange(1, length - len(probs) + 1)
    return np.concatenate([probs, extra])


def expected_accepted(cluster: np.ndarray, offered: ArrayLike) -> float | np.ndarray:
    """The drafted tokens a row would have had accepted at the cluster's acceptance: offered[k]
    of its rounds offered a (k + 1)-th drafted token, accepted with P(first k + 1 accepted).
    Compared with accepted / drafted, the drafts after a round's first rejection (never
    judged) do not count as rejections: a row drafting a longer γ than the cluster's rounds
    did, at the cluster's acceptance, would otherwise look worse than the cluster. cluster: # [gamma_max];
    offered: # [positions] for one row (a float back), or # [rows, positions] zero-padded
    (# [rows] back)."""
    counts = np.asarray(offered, dtype=np.float64)
    if counts.shape[-1] == 0:
        return 0.0 if counts.ndim == 1 else np.zeros(counts.shape[0])
    probs = extend_prefix_acceptance(tuple(np.asarray(cluster, dtype=np.float64).tolist()), counts.shape[-1])
    total = counts @ probs  # [] or [rows]
    return float(total) if counts.ndim == 1 else total


def row_prefix_acceptance(
    cluster: np.ndarray, cluster_alpha: float, drafted: ArrayLike, accepted: ArrayLike, prior_tokens: float,
    expected: ArrayLike | None = None,
) -> np.ndarray:
    """A row's P(first k accepted): the cluster's conditional rates scaled by how the row's
    accepted tokens compare with what the cluster's acceptance expected of its drafts
    (`expected_accepted`; None: its drafts at the cluster's mean positions, drafted · α),
    shrunk towards the cluster's as if the cluster had drafted prior_tokens tokens for it:
    (accepted + prior · α) / (expected + prior · α). drafted, accepted, expected: one row's
    (# [len(cluster)] back), or one per row (# [rows] each; # [rows, len(cluster)] back)."""
    drafted = np.asarray(drafted, dtype=np.float64)
    accepted = np.asarray(accepted, dtype=np.float64)
    assert drafted.shape == accepted.shape and drafted.ndim <= 1, (drafted.shape, accepted.shape)
    powers = np.arange(1, len(cluster) + 1)
    if cluster_alpha <= 0:
        total = drafted + prior_tokens
        own = np.divide(accepted, total, out=np.zeros_like(total), where=total > 0)
        return own[..., None] ** powers
    prior = prior_tokens * cluster_alpha
    expected = drafted * cluster_alpha if expected is None else np.asarray(expected, dtype=np.float64)
    assert expected.shape == drafted.shape, (expected.shape, drafted.shape)
    denominator = expected + prior
    scale = np.divide(accepted + prior, denominator, out=np.ones_like(denominator), where=denominator > 0)
    previous = np.concatenate([[1.0], cluster[:-1]])
    conditional = np.divide(cluster, previous, out=np.zeros_like(cluster), where=previous > 0)  # [len(cluster)]
    return np.cumprod(np.minimum(1.0, conditional * scale[..., None]), axis=-1)
