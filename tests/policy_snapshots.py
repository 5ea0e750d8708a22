"""Measured snapshots and rows for the policy's tests: round cost models, a snapshot measured
from rounds those models time (acceptance α per token), the policy's test settings, AUTO rows."""

import random


from specdec.policy.load_stats import LoadSnapshot, RoundSample, StatsWindow
from specdec.policy.round_cost import RoundCostModel
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.row_state import RowState

CHEAP_VERIFY = RoundCostModel(verify=(0.010, 0.0018), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
HEAVY_VERIFY = RoundCostModel(verify=(0.010, 0.0049), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
# the emulated H100 pair at time scale 8 after plain rounds of 32 rows (as in test_gamma_tpot_targets.py)
AFTER_PLAIN_32 = RoundCostModel(verify=(0.060, 0.0003, 0.0001, 0.0001, 0.002), draft=(0.004, 0.011, 0.00005, 0.0),
                                overhead_s=0.002, verify_tokens_high=47.6)


def settings(**kw):
    base = dict(gamma_max=8, fallback_gamma=2, stale_after_s=5.0, min_gain=0.05, min_dwell_s=1.0, explore_interval_s=0)
    base.update(kw)
    return PolicySettings(**base)


def snapshot(alpha=0.7, cost=CHEAP_VERIFY, at=100.0, qps=1.0, in_flight=1.0, noise=0.0, rng=None):
    """A snapshot measured from rounds timed by `cost` (± noise), with acceptance α per token."""
    rng = rng or random.Random(0)
    w = StatsWindow()
    w.add_arrival(int(qps * 10))
    for rows in (1, 2, 4, 8, 16):
        for gamma in (0, 1, 2, 4):
            gammas = [gamma] * rows
            accepted = [_accepted(alpha, gamma, rng) for _ in range(rows)]
            jitter = 1 + rng.uniform(-noise, noise)
            verify = cost.verify_s(rows * (gamma + 1)) * jitter
            draft = cost.draft_s(rows, gamma) * jitter
            w.add_round(RoundSample.from_rows(gammas, gammas, accepted, draft, verify,
                                              verify + draft + cost.overhead_s))
    return LoadSnapshot.from_window(w, 10.0, in_flight, 0, measured_at=at)


def _accepted(alpha, gamma, rng):
    n = 0
    while n < gamma and rng.random() < alpha:
        n += 1
    return n


def auto(n, cap=8, **kw):
    return [RowState("auto", None, cap, seq_id=f"s{i}", **kw) for i in range(n)]
