"""The live speculation picture, typed: what GetStats, the HTTP health route, `specdec status`
and the router's metrics read (one shape from the load monitor to every reader).

`ServerStatus` adds to the load monitor's view (`specdec.policy.policy_status.PolicyStatus`)
this replica's totals and round profile, and says whether speculation is unavailable (a draft
worker down) and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec.policy.policy_status import PolicyStatus


@dataclass(frozen=True)
class ServerStatus:
    """One replica's status: readiness, its totals, and the policy's view.

    ready: draft and target loaded and the engine loop running.
    problems: why it is not (fully) serving: loading, a load failure, speculation unavailable.
    rounds / drafted / accepted / acceptance_rate / mean_accepted_length: this replica's totals.
    requests_running / requests_waiting: this replica's requests now.
    policy: the load monitor's view, or a static one (no monitor: the configured γ).
    round_profile_ms: mean milliseconds per round part (see specdec.round.round_profile), with
        "rounds"; drafted-ahead rows and the look-ahead hit rate when drafting ahead.
    overlap_choice: the measured choice of drafting ahead (specdec.round.overlap_choice), when on.
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
