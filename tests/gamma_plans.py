"""Round cost models and a planning shortcut shared by the γ planner's tests (specdec.policy.gamma)."""

import numpy as np

from specdec.policy.gamma import plan_gammas
from specdec.policy.round_cost import RoundCostModel

# seconds: (fixed, per token) for the target; (fixed, per step, per row-step) for the draft
CPU_TINY_PAIR = RoundCostModel(verify=(0.010, 0.0018), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
COMPUTE_BOUND = RoundCostModel(verify=(0.001, 0.010), draft=(0.0, 0.0005, 0.0))  # every token costs a step


def geometric(alpha: float, width: int = 8) -> np.ndarray:
    """P(the first k drafted tokens are all accepted), k = 1 … width, each accepted with ``alpha``."""
    return alpha ** np.arange(1, width + 1)


def plan(alphas, cost, gamma_max=8, lo=None, hi=None, margin=0.0):
    """The plan for rows of these acceptance rates, each free to draft 0 … gamma_max (unless lo/hi)."""
    curves = np.stack([geometric(a, gamma_max) for a in alphas])
    rows = len(alphas)
    return plan_gammas(curves, lo or [0] * rows, hi or [gamma_max] * rows, cost, margin)
