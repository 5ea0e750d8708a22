"""The speculation policy's live view, typed: what the load monitor reports (cluster-wide when
it shares a store) and what GetStats, the HTTP health route and the metrics read through
`specdec.serving.server_status.ServerStatus`."""

from __future__ import annotations

from dataclasses import dataclass, field

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


def static_policy(gamma: int) -> PolicyStatus:
    """The view without a load monitor: always the configured γ."""
    return PolicyStatus(speculation_enabled=gamma > 0, gamma=gamma, reason="static γ (no load monitor)")
