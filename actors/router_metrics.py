"""Prometheus metrics of the router, exported through Ray's metrics agent (port 8080 by default).

Names follow vLLM's speculative-decoding metrics (Ray adds the `ray_` prefix on export):
  specdec_spec_decode_num_drafts                  counter   rounds that drafted tokens
  specdec_spec_decode_num_draft_tokens            counter   drafted tokens
  specdec_spec_decode_num_accepted_tokens         counter   accepted tokens
  specdec_spec_decode_num_accepted_tokens_per_pos counter   accepted tokens by drafted position ("position" tag)
  specdec_spec_decode_gamma                       gauge     largest γ the plan gave an AUTO request last round
  specdec_spec_decode_enabled                     gauge     1 while speculation is on (the plan's or the override's
                                                            state) and the proposer can draft
  specdec_spec_decode_unavailable                 gauge     1 while the default proposer cannot draft (draft worker down)
  specdec_spec_decode_off_because_of_load         gauge     1 while it is off because of load
  specdec_spec_decode_crossover_rows              gauge     rows per round beyond which speculation stops paying (0 unknown)
  specdec_spec_decode_acceptance_rate             gauge     α over the load monitor's window
  specdec_qps                                     gauge     cluster-wide arrivals per second
  specdec_num_requests_running / _waiting         gauge     this replica's requests
  specdec_time_to_first_token_seconds             histogram streams: call start -> first tokens
  specdec_inter_token_latency_seconds             histogram streams: gap between chunks / tokens in the chunk
"""

from __future__ import annotations

from typing import Any

from specdec.server_status import PolicyStatus, static_policy

LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


def _ray_metrics() -> tuple[Any, Any, Any]:
    from ray.util.metrics import Counter, Gauge, Histogram

    return Counter, Gauge, Histogram


class RouterMetrics:
    """Counters follow the engine's totals (polled), gauges the load monitor's status."""

    def __init__(self, classes: tuple[Any, Any, Any] | None = None) -> None:
        counter, gauge, histogram = classes or _ray_metrics()
        p = "specdec_spec_decode_"
        self.num_drafts = counter(f"{p}num_drafts", description="Rounds that drafted tokens")
        self.draft_tokens = counter(f"{p}num_draft_tokens", description="Drafted tokens")
        self.accepted_tokens = counter(f"{p}num_accepted_tokens", description="Accepted drafted tokens")
        self.accepted_per_pos = counter(f"{p}num_accepted_tokens_per_pos", description="Accepted tokens by drafted position",
                                        tag_keys=("position",))
        self.gamma = gauge(f"{p}gamma", description="gamma for AUTO requests now")
        self.enabled = gauge(f"{p}enabled", description="1 while speculation is switched on")
        self.unavailable = gauge(f"{p}unavailable", description="1 while the proposer cannot draft (draft worker down)")
        self.off_for_load = gauge(f"{p}off_because_of_load", description="1 while speculation is off because of load")
        self.crossover = gauge(f"{p}crossover_rows", description="Rows per round beyond which speculation stops paying")
        self.acceptance = gauge(f"{p}acceptance_rate", description="Acceptance rate over the window")
        self.qps = gauge("specdec_qps", description="Cluster-wide arrivals per second")
        self.running = gauge("specdec_num_requests_running", description="Requests running on this replica")
        self.waiting = gauge("specdec_num_requests_waiting", description="Requests queued on this replica")
        self.ttft = histogram("specdec_time_to_first_token_seconds", description="Time to first token (streams)",
                              boundaries=LATENCY_BUCKETS)
        self.itl = histogram("specdec_inter_token_latency_seconds", description="Inter-token latency (streams)",
                             boundaries=LATENCY_BUCKETS)
        self._seen = {"rounds_with_drafts": 0, "drafted": 0, "accepted": 0, "per_pos": []}

    def update(self, engine: Any, policy: PolicyStatus | dict[str, Any] | None) -> None:
        """Poll the engine's totals (add the increase to the counters) and set the gauges from
        the load monitor's typed status (None: no monitor, the engine's static γ)."""
        stats = engine.stats
        drafted_rounds = stats.drafted_per_position[0] if stats.drafted_per_position else 0
        for counter, key, total in ((self.num_drafts, "rounds_with_drafts", drafted_rounds),
                                    (self.draft_tokens, "drafted", stats.drafted),
                                    (self.accepted_tokens, "accepted", stats.accepted)):
            if total > self._seen[key]:
                counter.inc(total - self._seen[key])
                self._seen[key] = total
        seen = self._seen["per_pos"]
        for i, total in enumerate(stats.accepted_per_position):
            before = seen[i] if i < len(seen) else 0
            if total > before:
                self.accepted_per_pos.inc(total - before, tags={"position": str(i)})
        self._seen["per_pos"] = list(stats.accepted_per_position)
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        policy = _as_policy(policy) or static_policy(engine.gamma)
        unavailable = getattr(getattr(engine, "proposer", None), "unavailable_reason", None) is not None
        self.gamma.set(policy.gamma)
        self.enabled.set(1.0 if policy.speculation_enabled and not unavailable else 0.0)
        self.unavailable.set(1.0 if unavailable else 0.0)
        self.off_for_load.set(1.0 if policy.off_because_of_load else 0.0)
        self.crossover.set(float(policy.crossover.rows or 0))
        if policy.alpha is not None:
            self.acceptance.set(policy.alpha)
        self.qps.set(policy.qps)

    def observe_stream(self, first_token_s: float | None, gaps: list[tuple[float, int]]) -> None:
        """first_token_s: call start -> first chunk with tokens; gaps: (seconds, tokens) per later chunk."""
        if first_token_s is not None:
            self.ttft.observe(first_token_s)
        for seconds, tokens in gaps:
            if tokens > 0:
                for _ in range(tokens):
                    self.itl.observe(seconds / tokens)


def _as_policy(status: PolicyStatus | dict[str, Any] | None) -> PolicyStatus | None:
    """The typed status (a plain mapping of PolicyStatus fields is accepted too)."""
    if status is None or isinstance(status, PolicyStatus):
        return status
    return PolicyStatus(**status)
