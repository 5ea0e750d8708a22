"""Switching speculation off under high load, with hysteresis so that it does not flap.

Speculation buys latency at low load and costs throughput at high load. By default the
goodput plan decides (`specdec.policy.speculation_policy`) and this switch only records its
on/off state with a dwell time. An operator may instead force it by load: OFF when the
cluster-wide arrival rate (QPS) or the requests in flight rise above the `disable_*`
thresholds, ON again only when both are below the lower `enable_*` thresholds — and never
sooner than `min_dwell_s` after the last switch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoadThresholds:
    disable_qps: float
    enable_qps: float
    disable_in_flight: float
    enable_in_flight: float
    min_dwell_s: float

    def __post_init__(self) -> None:
        if not 0 <= self.enable_qps < self.disable_qps:
            raise ValueError(f"need 0 <= enable_qps ({self.enable_qps}) < disable_qps ({self.disable_qps})")
        no_in_flight = self.enable_in_flight == self.disable_in_flight == math.inf  # QPS alone decides
        if not (0 <= self.enable_in_flight < self.disable_in_flight or no_in_flight):
            raise ValueError(
                f"need 0 <= enable_in_flight ({self.enable_in_flight}) < disable_in_flight ({self.disable_in_flight})"
            )
        if self.min_dwell_s < 0:
            raise ValueError(f"min_dwell_s must be >= 0, got {self.min_dwell_s}")

    @classmethod
    def from_config(cls, config: Any) -> "LoadThresholds | None":
        """The operator's override of `config` (load_monitor.disable_* / enable_*; None: not
        set). Without in-flight thresholds, in flight never switches it (both infinite)."""
        if config.disable_qps is None:
            return None
        no_limit = (math.inf if config.disable_in_flight is None else config.disable_in_flight,
                    math.inf if config.enable_in_flight is None else config.enable_in_flight)
        return cls(config.disable_qps, config.enable_qps, *no_limit, config.min_dwell_s)


class LoadSwitch:
    """Speculation on/off with hysteresis and a minimum dwell time between changes.

    Fed either by load thresholds (`update`: the operator's QPS / in-flight switch) or by
    the goodput plan (`set`: the policy changes it only after the dwell time)."""

    def __init__(self, thresholds: LoadThresholds | None, min_dwell_s: float, enabled: bool = True,
                 since: float = float("-inf")) -> None:
        self.thresholds = thresholds
        self.min_dwell_s = min_dwell_s
        self.enabled = enabled
        self.since = since  # time of the last switch

    def update(self, qps: float, in_flight: float, now: float) -> bool:
        """Feed the load to the operator's thresholds; returns whether speculation is enabled."""
        t = self.thresholds
        if t is None:
            raise ValueError("this switch has no load thresholds: the goodput plan sets it")
        if self.enabled and (qps > t.disable_qps or in_flight > t.disable_in_flight):
            self.set(False, now)
        elif not self.enabled and qps < t.enable_qps and in_flight < t.enable_in_flight:
            self.set(True, now)
        return self.enabled

    def set(self, enabled: bool, now: float) -> None:
        """Change the state unless the last change was less than min_dwell_s ago."""
        if enabled != self.enabled and now - self.since >= self.min_dwell_s:
            self.enabled, self.since = enabled, now
