"""Goodness of fit of generated tokens to a target distribution, for statistical tests.

`reference_probs` processes logits from the definitions (numpy, independent of
specdec/sampling/sampling.py); `p_value` is a chi-squared test of observed outcomes against it.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from specdec.sampling.sampling_params import SamplingParams

ALPHA = 1e-4  # family-wise error rate of each test
MIN_EXPECTED = 5.0  # cells expected fewer times are pooled


def reference_probs(logits: np.ndarray, params: SamplingParams, check_margins: bool = True) -> np.ndarray:
    """Processed probabilities of logits [V] from the definitions: softmax(logits / T); top-k
    keeps the k largest logits (ties with the k-th too); top-p then keeps the smallest set of
    most likely tokens whose mass reaches top_p (ties with the last kept one too).
    The verifier's batched forward gives logits ~4e-6 away from the ones here, so the
    cut-offs must be clear of that (asserted unless check_margins is False)."""
    x = np.asarray(logits, dtype=np.float64) / params.temperature
    if params.top_k:
        ordered = np.sort(x)[::-1]
        assert not check_margins or ordered[params.top_k - 1] - ordered[params.top_k] > 1e-4, "top-k cut-off too close"
        x = np.where(x >= ordered[params.top_k - 1], x, -np.inf)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        ordered = np.sort(probs)[::-1]
        mass = np.cumsum(ordered)
        assert not check_margins or np.abs(mass - params.top_p).min() > 2e-5, "top-p cut-off too close"
        kept = int(np.argmax(mass >= params.top_p)) + 1
        probs = np.where(probs >= ordered[kept - 1], probs, 0.0)
        probs /= probs.sum()
    return probs


def p_value(outcomes: np.ndarray, probs: dict[int, float]) -> float:
    """Chi-squared goodness of fit of observed outcomes (ints) to {outcome: probability};
    0.0 when an outcome of zero probability occurs. Cells expected fewer than MIN_EXPECTED
    times are pooled into one (folded into the largest cell when still too small)."""
    cells, observed = np.unique(outcomes, return_counts=True)
    if any(probs.get(int(c), 0.0) <= 0 for c in cells):
        return 0.0
    counted = dict(zip(cells.tolist(), observed.tolist()))
    keys = [k for k, v in probs.items() if v > 0]
    obs = np.array([counted.get(k, 0) for k in keys], dtype=np.float64)
    exp = np.array([probs[k] for k in keys]) / sum(probs[k] for k in keys) * len(outcomes)
    small = exp < MIN_EXPECTED
    obs_cells, exp_cells = list(obs[~small]), list(exp[~small])
    if small.any():
        if exp[small].sum() >= MIN_EXPECTED:
            obs_cells.append(obs[small].sum())
            exp_cells.append(exp[small].sum())
        else:
            obs_cells[int(np.argmax(exp_cells))] += obs[small].sum()
            exp_cells[int(np.argmax(exp_cells))] += exp[small].sum()
    return float(stats.chisquare(obs_cells, exp_cells).pvalue) if len(obs_cells) > 1 else 1.0


def as_table(probs: np.ndarray) -> dict[int, float]:
    return {int(i): float(probs[i]) for i in np.flatnonzero(probs)}
