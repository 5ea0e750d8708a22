"""Prometheus metrics of the model workers (the draft worker and the target group's leader),
exported by the workers themselves through Ray's metrics agent, like the router's (router_metrics.py).

  specdec_worker_compute_time_seconds    histogram Propose / Verify compute of each call that
                                                   succeeded ("rpc" tag), the compute_seconds of the reply
  specdec_worker_calls                   counter   calls by "rpc" (Propose, Verify, Release, KeepAlive,
                                                   GetInfo) and "code" (gRPC status: OK,
                                                   INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE,
                                                   INTERNAL, CANCELLED)
  specdec_worker_draft_tokens            counter   tokens the draft worker drafted (role draft)
  specdec_worker_verified_tokens         counter   drafted tokens the target verified (role target)
  specdec_worker_kv_cache_slots_used     gauge     the worker's KV-cache slots in use
  specdec_worker_kv_cache_slots          gauge     the worker's KV-cache slots in all
  specdec_worker_leases                  gauge     router leases the worker knows (live, or lapsed and
                                                   not yet reaped)
  specdec_worker_sequences               gauge     sequences the worker holds state for
  specdec_worker_expired_sequences       counter   sequences freed because their router's lease lapsed
Every metric carries "model" (the served target model, as on the router's metrics, so that one
dashboard filter selects a deployment's router and workers), "role" (draft or target) and, on
the target, "rank" (the tensor-parallel rank that serves: 0).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec_metrics.router_metrics import LATENCY_BUCKETS, ray_metric_classes, tagged

logger = logging.getLogger(__name__)

ROLES = ("draft", "target")
DEFAULT_POLL_S = 1.0


@dataclass(frozen=True)
class WorkerState:
    """What the gauges show: the worker's cache and leases now."""

    slots: int
    free_slots: int
    leases: int
    sequences: int
    expired_sequences: int  # total so far (the counter adds the increase)


class WorkerMetrics:
    """A worker's metrics: calls and compute as they happen, cache and leases when polled."""

    def __init__(self, classes: tuple[Any, Any, Any] | None = None, model: str = "", role: str = "draft",
                 rank: int | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if (rank is None) != (role == "draft"):
            raise ValueError("a target worker's metrics need its rank, a draft worker's none")
        tags = {"role": role} if rank is None else {"role": role, "rank": str(rank)}
        counter, gauge, histogram = tagged(classes or ray_metric_classes(), model, **tags)
        self.role = role
        self.compute_time = histogram("specdec_worker_compute_time_seconds",
                                      description="Propose / Verify compute per call",
                                      boundaries=LATENCY_BUCKETS, tag_keys=("rpc",))
        self.calls = counter("specdec_worker_calls", description="Worker calls by rpc and status code",
                             tag_keys=("rpc", "code"))
        if role == "draft":
            self.tokens = counter("specdec_worker_draft_tokens", description="Tokens the draft worker drafted")
        else:
            self.tokens = counter("specdec_worker_verified_tokens", description="Drafted tokens the target verified")
        self.slots_used = gauge("specdec_worker_kv_cache_slots_used", description="KV-cache slots in use")
        self.slots = gauge("specdec_worker_kv_cache_slots", description="KV-cache slots in all")
        self.leases = gauge("specdec_worker_leases", description="Router leases the worker knows")
        self.sequences = gauge("specdec_worker_sequences", description="Sequences the worker holds state for")
        self.expired = counter("specdec_worker_expired_sequences",
                               description="Sequences freed because their lease lapsed")
        self._expired_seen = 0

    @classmethod
    def off(cls, role: str = "draft", rank: int | None = None) -> "WorkerMetrics":
        """Metrics that record nothing (a servicer run without Ray: tests, scripts)."""
        return cls((_Off, _Off, _Off), role=role, rank=rank)

    def observe_call(self, rpc: str, code: str = "OK") -> None:
        """One call ended with status `code` (a grpc.StatusCode name)."""
        self.calls.inc(1, tags={"rpc": rpc, "code": code})

    def observe_compute(self, rpc: str, seconds: float, tokens: int) -> None:
        """A Propose / Verify call's compute and the tokens it drafted / verified."""
        self.compute_time.observe(seconds, tags={"rpc": rpc})
        if tokens > 0:
            self.tokens.inc(tokens)

    def update(self, state: WorkerState) -> None:
        """Set the gauges; the expired counter adds the increase since the last update."""
        self.slots.set(state.slots)
        self.slots_used.set(state.slots - state.free_slots)
        self.leases.set(state.leases)
        self.sequences.set(state.sequences)
        if state.expired_sequences > self._expired_seen:
            self.expired.inc(state.expired_sequences - self._expired_seen)
        self._expired_seen = max(self._expired_seen, state.expired_sequences)

    def poll(self, state: Callable[[], WorkerState], period_s: float = DEFAULT_POLL_S) -> asyncio.Task:
        """Update the gauges from state() now and every period_s on the running event loop
        (the worker server's); cancel the task to stop."""
        async def run() -> None:
            while True:
                try:
                    self.update(state())
                except Exception:  # noqa: BLE001 - metrics must not end the worker's loop
                    logger.exception("updating the worker metrics failed")
                await asyncio.sleep(period_s)

        return asyncio.get_running_loop().create_task(run(), name="worker-metrics")


class _Off:
    """A metric that records nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_default_tags(self, tags: dict[str, str]) -> None:
        pass

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        pass

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        pass

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        pass
