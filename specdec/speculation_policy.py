"""The speculation decision: load switch + goodput-optimal γ + per-request overrides.

Pure code: it reads a `LoadSnapshot` (cluster-wide measurements, from any store) and the
current batch size, and answers "speculate, and with which γ?". Stale or missing
measurements fall back to a configured safe γ.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.gamma import optimal_gamma
from specdec.load_stats import LoadSnapshot
from specdec.load_switch import LoadSwitch, LoadThresholds

MODE_AUTO, MODE_ON, MODE_OFF = "auto", "on", "off"


@dataclass(frozen=True)
class PolicySettings:
    gamma_max: int  # largest γ the policy may choose
    fallback_gamma: int  # γ when measurements are missing or stale
    stale_after_s: float  # a snapshot older than this is ignored
    min_gain: float  # a γ > 0 must beat plain decoding by this fraction
    default_verify_slope: float  # s assumed until verify timings at several γ exist
    thresholds: LoadThresholds


@dataclass(frozen=True)
class Decision:
    gamma: int  # γ for AUTO requests this round (0 = speculation off)
    enabled: bool  # the load switch's state
    reason: str  # why, for status displays and logs


class SpeculationPolicy:
    """Decides γ for each round from the latest snapshot; keeps the switch's hysteresis state."""

    def __init__(self, settings: PolicySettings) -> None:
        if not 0 <= settings.fallback_gamma <= settings.gamma_max:
            raise ValueError(
                f"fallback_gamma ({settings.fallback_gamma}) must be in [0, gamma_max={settings.gamma_max}]"
            )
        self.settings = settings
        self.switch = LoadSwitch(settings.thresholds)

    def decide(self, snapshot: LoadSnapshot | None, batch_size: int, now: float, update_switch: bool = True) -> Decision:
        """update_switch=False only reads the switch (the request path); a background task
        feeds it the load."""
        s = self.settings
        if snapshot is None or now - snapshot.measured_at > s.stale_after_s:
            return Decision(s.fallback_gamma, self.switch.enabled, "no fresh measurements: fallback γ")
        load = snapshot.in_flight + snapshot.queued
        enabled = self.switch.update(snapshot.qps, load, now) if update_switch else self.switch.enabled
        if not enabled:
            return Decision(0, False, f"load high (qps {snapshot.qps:.1f}, in flight {snapshot.in_flight:.0f})")
        costs = snapshot.cost_model(max(1, batch_size), s.default_verify_slope)
        if snapshot.alpha is None or costs is None:
            return Decision(s.fallback_gamma, True, "acceptance or cost not measured yet: fallback γ")
        gamma = optimal_gamma(snapshot.alpha, costs, s.gamma_max, s.min_gain, snapshot.alpha_per_position)
        reason = (f"γ* for α {snapshot.alpha:.2f}, c {costs.draft_cost:.2f}, o {costs.draft_overhead:.2f}, "
                  f"s {costs.verify_slope:.2f}")
        return Decision(gamma, True, reason)

    @staticmethod
    def gamma_for_request(decision: Decision, mode: str, requested_gamma: int | None, default_gamma: int) -> int:
        """A request's γ: OFF (or γ 0) -> 0; ON -> its γ, else the server's configured γ
        (fixed, whatever the load); AUTO -> 0 while the policy says off, else its γ or the
        policy's γ*."""
        if mode not in (MODE_AUTO, MODE_ON, MODE_OFF):
            raise ValueError(f"speculation mode must be auto, on or off, got {mode!r}")
        if mode == MODE_OFF or requested_gamma == 0:
            return 0
        if mode == MODE_ON:
            return requested_gamma or default_gamma
        if decision.gamma == 0:
            return 0
        return requested_gamma or decision.gamma
