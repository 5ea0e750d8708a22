"""PolicySettings: the goodput policy's knobs (`SpeculationPolicy`), read from a
load_monitor config section."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from specdec.policy.load_switch import LoadThresholds


@dataclass(frozen=True)
class PolicySettings:
    gamma_max: int  # largest γ the policy may choose
    fallback_gamma: int  # γ when measurements are missing or stale
    stale_after_s: float  # a snapshot older than this is ignored
    min_gain: float  # the cost model's error band, a fraction (the switch's hysteresis, each round's margin)
    min_dwell_s: float  # least seconds between two on/off changes of the plan
    prior_tokens: float = 200.0  # a row's acceptance counts as this many drafted tokens of the cluster's
    explore_interval_s: float = 5.0  # at most one exploration round per this many seconds (0 = never)
    explore_gamma: int = 4  # exploration rounds draft 1, 2, … explore_gamma tokens in turn
    explore_rows: int = 1  # at most this many rows explore in such a round
    max_round_ratio: float = 0.0  # a planned round takes at most this × the plain round (0 = unbounded)
    tpot_target_s: float | None = None  # a row's TPOT target when its request sets none (None = no target)
    thresholds: LoadThresholds | None = None  # an operator's forced load switch (None = follow the plan)

    @classmethod
    def from_config(cls, config: Any) -> "PolicySettings":
        """The settings of a load_monitor section: each field from the key of its name (the
        TPOT target from tpot_target_ms, in seconds)."""
        derived = ("thresholds", "tpot_target_s")
        own = {f.name: getattr(config, f.name) for f in fields(cls) if f.name not in derived}
        target_ms = config.tpot_target_ms
        return cls(**own, tpot_target_s=None if target_ms is None else target_ms / 1000.0,
                   thresholds=LoadThresholds.from_config(config))
