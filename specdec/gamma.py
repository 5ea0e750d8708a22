"""Choosing γ: the goodput model of speculative decoding (Leviathan et al., 2023).

With acceptance rate α (each drafted token accepted independently with probability α), a
round that drafts γ tokens emits on average

    E[tokens | α, γ] = (1 − α^(γ+1)) / (1 − α)          (γ + 1 when α = 1)

tokens, including the recovered/bonus token. Its cost, in units of one plain target step
at the current batch size, is

    cost(γ) = γ·c + 1 + s·γ

where c is the draft step time over the target step time (measured) and s is the extra
target time per additional verified token (measured; ≈ 0 when verification is memory-bound
at small batches, → 1 when the target is compute-bound at large batches). A round that
drafts also pays a fixed draft-call overhead o (a network hop, the catch-up feed), so
cost(γ > 0) = 1 + o + γ·(c + s). γ* maximises goodput E[tokens] / cost over
γ ∈ {0, …, γ_max}; γ = 0 is plain decoding (goodput 1).

Acceptance is rarely independent across positions (easy stretches of text are easy for
several tokens), so when the per-position acceptance is measured —
P(the first i drafted tokens all accepted), i = 1, 2, … — E[tokens] uses it directly and
extrapolates beyond the measured positions with the last measured conditional rate.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens_measured(prefix_acceptance: list[float] | tuple[float, ...], gamma: int) -> float:
    """E[tokens | γ] = 1 + Σ_{i=1..γ} P(first i drafted tokens accepted), from measured
    prefix acceptance; positions past the measured ones continue geometrically with the
    last measured conditional acceptance P(i accepted | first i − 1 accepted)."""
    if not prefix_acceptance:
        raise ValueError("prefix_acceptance must not be empty")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    probs = [min(1.0, max(0.0, p)) for p in prefix_acceptance]
    last = probs[-1]
    previous = probs[-2] if len(probs) > 1 else 1.0
    tail = min(1.0, last / previous) if previous > 0 else 0.0
    total, p = 1.0, 1.0
    for i in range(gamma):
        p = probs[i] if i < len(probs) else p * tail
        total += p
    return total


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
    draft_overhead: o, fixed cost of a round's draft call / one target step (>= 0).
    """

    draft_cost: float
    verify_slope: float
    draft_overhead: float = 0.0

    def __post_init__(self) -> None:
        if min(self.draft_cost, self.verify_slope, self.draft_overhead) < 0:
            raise ValueError(
                f"costs must be >= 0, got c={self.draft_cost}, s={self.verify_slope}, o={self.draft_overhead}"
            )

    def round_cost(self, gamma: int) -> float:
        if gamma == 0:
            return 1.0
        return 1.0 + self.draft_overhead + gamma * (self.draft_cost + self.verify_slope)


def goodput(alpha: float, gamma: int, costs: CostModel, prefix_acceptance: tuple[float, ...] = ()) -> float:
    """Expected tokens per unit of target-step time; plain decoding has goodput 1.
    prefix_acceptance: measured P(first i accepted), i = 1, 2, … (empty = independent α)."""
    tokens = expected_tokens_measured(prefix_acceptance, gamma) if prefix_acceptance else expected_tokens(alpha, gamma)
    return tokens / costs.round_cost(gamma)


def optimal_gamma(
    alpha: float, costs: CostModel, gamma_max: int, min_gain: float = 0.0, prefix_acceptance: tuple[float, ...] = ()
) -> int:
    """γ* in {0, …, gamma_max} maximising goodput; ties go to the smaller γ.

    min_gain: a γ > 0 must beat plain decoding by this fraction (e.g. 0.05 = 5 %) to be
    chosen, so that noise in the measurements does not switch speculation on for nothing.
    """
    if gamma_max < 0:
        raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
    best_gamma, best = 0, goodput(alpha, 0, costs) * (1.0 + min_gain)
    for gamma in range(1, gamma_max + 1):
        value = goodput(alpha, gamma, costs, prefix_acceptance)
        if value > best + 1e-12:
            best_gamma, best = gamma, value
    return best_gamma
