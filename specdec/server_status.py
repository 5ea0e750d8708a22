"""The live speculation picture, typed: what GetStats, the HTTP health route, `specdec status`
and the router's metrics read (one shape from the load monitor to every reader).

`PolicyStatus` is the load monitor's view (cluster-wide when it shares a store);
`ServerStatus` adds this replica's totals and round profile and says whether speculation
is unavailable (a draft worker down) and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec.policy.round_cost import RoundCostModel
from specdec.policy.speculation_policy import Crossover


@dataclass(frozen=True)
class PolicyStatus:
    """The γ policy's decision and its measurements.

    source: "shared" (the load store) or "local" (this replica's own measurements).
    breaker: the store's circuit breaker ("closed", "open", "half-open").
    speculation_enabled / gamma / reason: what the plan gives AUTO requests now, and why.
    off_because_of_load: off while a lone request would speculate (past the crossover, or
        the operator's load switch).
    crossover: rows per round (and requests/s) beyond which speculation stops paying.
    round_cost: the round cost model the plan uses (fitted; drafting as last measured while
        the window holds few drafts; None until measured).
    qps / in_flight / queued: cluster-wide arrivals per second and load.
    alpha / mean_accepted_length / alpha_per_position: acceptance over the window (None
        until something was drafted).
    """

    source: str = "local"
    breaker: str = "closed"
    speculation_enabled: bool = False
    gamma: int = 0
    reason: str = ""
    off_because_of_load: bool = False
    crossover: Crossover = field(default_factory=lambda: Crossover(None, None))
    round_cost: RoundCostModel | None = None
    qps: float = 0.0
    in_flight: float = 0.0
    queued: float = 0.0
    alpha: float | None = None
    mean_accepted_length: float | None = None
    alpha_per_position: tuple[float, ...] = ()


@dataclass(frozen=True)
class ServerStatus:
    """One replica's status: readiness, its totals, and the policy's view.

    ready: draft and target loaded and the engine loop running.
    problems: why it is not (fully) serving: loading, a load failure, speculation unavailable.
    rounds / drafted / accepted / acceptance_rate / mean_accepted_length: this replica's totals.
    requests_running / requests_waiting: this replica's requests now.
    policy: the load monitor's view, or a static one (no monitor: the configured γ).
    round_profile_ms: mean milliseconds per round part (see specdec.round_profile), with
        "rounds"; drafted-ahead rows and the look-ahead hit rate when drafting ahead.
    overlap_choice: the measured choice of drafting ahead (specdec.overlap_choice), when on.
    speculation_unavailable: why speculation cannot run now (None when it can).
    """

    ready: bool
    problems: tuple[str, ...] = ()
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    mean_accepted_length: float = 0.0
    requests_running: int = 0
    requests_waiting: int = 0
    policy: PolicyStatus = field(default_factory=PolicyStatus)
    round_profile_ms: dict[str, float] = field(default_factory=dict)
    rounds_profiled: int = 0
    draft_ahead: tuple[int, float] | None = None  # (rows drafted ahead, look-ahead hit rate)
    # (tokens/s looking ahead, tokens/s in sequential rounds (0 = not measured), looking ahead now)
    overlap_choice: tuple[float, float, bool] | None = None
    speculation_unavailable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (the HTTP health route)."""
        policy = self.policy
        return {
            "ready": self.ready, "problems": list(self.problems),
            "speculation_enabled": policy.speculation_enabled and self.speculation_unavailable is None,
            "gamma": policy.gamma, "reason": policy.reason, "off_because_of_load": policy.off_because_of_load,
            "qps": policy.qps, "in_flight": policy.in_flight, "queued": policy.queued,
            "acceptance_rate": policy.alpha if policy.alpha is not None else self.acceptance_rate,
            "measurements_source": policy.source, "circuit_breaker": policy.breaker,
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "mean_accepted_length": self.mean_accepted_length,
            "requests_running": self.requests_running, "requests_waiting": self.requests_waiting,
        }


def static_policy(gamma: int) -> PolicyStatus:
    """The view without a load monitor: always the configured γ."""
    return PolicyStatus(speculation_enabled=gamma > 0, gamma=gamma, reason="static γ (no load monitor)")
