"""Choosing γ: the goodput model of speculative decoding (Leviathan et al., 2023).

With acceptance rate α (each drafted token accepted independently with probability α), a
round that drafts γ tokens emits on average

    E[tokens | α, γ] = (1 − α^(γ+1)) / (1 − α)          (γ + 1 when α = 1)

tokens, including the recovered/bonus token. Its cost, in units of one plain target step
at the current batch size, is

    cost(γ) = γ·c + 1 + s·γ

where c is the draft step time over the target step time (measured) and s is the extra
target time per additional verified token (measured; ≈ 0 when verification is memory-bound
at small batches, → 1 when the target is compute-bound at large batches). γ* maximises
goodput E[tokens] / cost over γ ∈ {0, …, γ_max}; γ = 0 is plain decoding (goodput 1).
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(alpha: float, gamma: int) -> float:
    """Mean tokens a round emits (accepted + the recovered/bonus token)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class CostModel:
    """Per-round costs relative to one plain target step at the current batch size.

    draft_cost: c, one draft step / one target step (>= 0).
    verify_slope: s, extra target time per additional verified token / one target step (>= 0).
    """

    draft_cost: float
    verify_slope: float

    def __post_init__(self) -> None:
        if self.draft_cost < 0 or self.verify_slope < 0:
            raise ValueError(f"costs must be >= 0, got c={self.draft_cost}, s={self.verify_slope}")

    def round_cost(self, gamma: int) -> float:
        return gamma * self.draft_cost + 1.0 + self.verify_slope * gamma


def goodput(alpha: float, gamma: int, costs: CostModel) -> float:
    """Expected tokens per unit of target-step time; plain decoding has goodput 1."""
    return expected_tokens(alpha, gamma) / costs.round_cost(gamma)


def optimal_gamma(alpha: float, costs: CostModel, gamma_max: int, min_gain: float = 0.0) -> int:
    """γ* in {0, …, gamma_max} maximising goodput; ties go to the smaller γ.

    min_gain: a γ > 0 must beat plain decoding by this fraction (e.g. 0.05 = 5 %) to be
    chosen, so that noise in the measurements does not switch speculation on for nothing.
    """
    if gamma_max < 0:
        raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
    best_gamma, best = 0, goodput(alpha, 0, costs) * (1.0 + min_gain)
    for gamma in range(1, gamma_max + 1):
        value = goodput(alpha, gamma, costs)
        if value > best + 1e-12:
            best_gamma, best = gamma, value
    return best_gamma
