"""Rounds of varied shapes timed by a known round cost model: what the cost model's tests fit."""

import random

from specdec.policy.load_stats import StatsWindow
from specdec.policy.round_cost import RoundCostModel, RoundShape, add_round_timing

TRUE = RoundCostModel(verify=(0.010, 0.0016), draft=(0.0015, 0.003, 0.0004), overhead_s=0.0005)


def verify_s(model, shape):
    """What `model` says the target's call for this round shape takes."""
    return model.verify_s(shape.rows, shape.drafted, shape.prompt_tokens)


def timed_rounds(n=200, noise=0.0, seed=0, gammas=(0, 1, 2, 4, 6), model=TRUE):
    """Rounds of varied shapes timed by `model` (± a relative noise)."""
    rng = random.Random(seed)
    window = StatsWindow()
    for _ in range(n):
        rows = rng.randint(1, 16)
        row_gammas = [rng.choice(gammas) for _ in range(rows)]
        drafting = [g for g in row_gammas if g > 0]
        shape = RoundShape(rows, sum(row_gammas) + rows, len(drafting), max(drafting, default=0))
        jitter = lambda x: x * (1 + rng.uniform(-noise, noise))  # noqa: E731
        verify = jitter(verify_s(model, shape))
        draft = jitter(model.draft_s(shape.draft_rows, shape.steps))
        add_round_timing(window.add, shape, verify, draft, verify + draft + model.overhead_s)
    return window
