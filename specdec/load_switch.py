"""Switching speculation off under high load, with hysteresis so that it does not flap.

Speculation buys latency at low load and costs throughput at high load. The switch turns
speculation OFF when the cluster-wide arrival rate (QPS) or the requests in flight rise
above the `disable_*` thresholds, and ON again only when both are below the lower
`enable_*` thresholds — and never sooner than `min_dwell_s` after the last switch.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        if not 0 <= self.enable_in_flight < self.disable_in_flight:
            raise ValueError(
                f"need 0 <= enable_in_flight ({self.enable_in_flight}) < disable_in_flight ({self.disable_in_flight})"
            )
        if self.min_dwell_s < 0:
            raise ValueError(f"min_dwell_s must be >= 0, got {self.min_dwell_s}")


class LoadSwitch:
    """Speculation on/off as a function of load, with hysteresis and a minimum dwell time."""

    def __init__(self, thresholds: LoadThresholds, enabled: bool = True, since: float = float("-inf")) -> None:
        self.thresholds = thresholds
        self.enabled = enabled
        self.since = since  # time of the last switch

    def update(self, qps: float, in_flight: float, now: float) -> bool:
        """Feed the current load; returns whether speculation is enabled."""
        t = self.thresholds
        if now - self.since < t.min_dwell_s:
            return self.enabled
        if self.enabled and (qps > t.disable_qps or in_flight > t.disable_in_flight):
            self.enabled, self.since = False, now
        elif not self.enabled and qps < t.enable_qps and in_flight < t.enable_in_flight:
            self.enabled, self.since = True, now
        return self.enabled
