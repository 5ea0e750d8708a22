"""The LoadStore interface: where router replicas share measurements and the on/off switch.

`RedisLoadStore` (in the shell) shares them across the cluster; `InProcessLoadStore` keeps
them in this process (single replica, tests, or when no Redis is configured).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from specdec.policy.load_stats import LoadSnapshot, StatsWindow
from specdec.policy.window_ring import WindowRing

COST_BUCKETS = 10  # the cost window's resolution: a tenth of it (it changes slowly; fewer reads)


def cost_window(window_s: float, bucket_s: float, cost_window_s: float | None) -> tuple[float, float]:
    """(seconds, bucket seconds) a store keeps the round-cost and acceptance sums for:
    cost_window_s, at least the load window (None: the load window), in buckets of a tenth
    of it, at least bucket_s."""
    seconds = max(window_s, cost_window_s or window_s)
    return seconds, max(bucket_s, seconds / COST_BUCKETS)


@dataclass(frozen=True)
class SwitchState:
    """The shared state of the load switch: on/off and when it last changed."""

    enabled: bool = True
    since: float = float("-inf")


class LoadStore(ABC):
    """Shared, additive load measurements plus the shared switch state."""

    @abstractmethod
    def push(
        self, replica_id: str, delta: StatsWindow, at: float, in_flight: int, queued: int, push_id: str | None = None
    ) -> bool:
        """Add a replica's measurements since its last push and report its current load.
        A push_id makes the push idempotent: a push whose id was applied already (a retry
        after a timeout the store had in fact executed) changes nothing. Returns whether
        it was applied."""

    @abstractmethod
    def snapshot(self, now: float) -> LoadSnapshot:
        """Sum every replica's recent measurements (dead replicas age out): the last
        window_s seconds, and the deployment's sums (round costs, acceptance) over the last
        cost_window_s."""

    @abstractmethod
    def switch_state(self) -> SwitchState:
        """The current shared switch state."""

    @abstractmethod
    def compare_and_set_switch(self, expected: SwitchState, new: SwitchState) -> bool:
        """Set the switch state only if it is still `expected` (one decision for all replicas)."""


class InProcessLoadStore(LoadStore):
    """A LoadStore in this process's memory (thread-safe)."""

    def __init__(self, window_s: float = 10.0, bucket_s: float = 1.0, replica_ttl_s: float = 5.0,
                 cost_window_s: float | None = None) -> None:
        """cost_window_s: how long the round cost and acceptance sums are kept (None: window_s)."""
        self.window_s = window_s
        self.cost_window_s, cost_bucket_s = cost_window(window_s, bucket_s, cost_window_s)
        self.replica_ttl_s = replica_ttl_s
        self._ring = WindowRing(window_s, bucket_s)
        self._costs = WindowRing(self.cost_window_s, cost_bucket_s)
        self._replicas: dict[str, tuple[int, int, float]] = {}
        self._switch = SwitchState()
        self._lock = threading.Lock()
        self._applied: dict[str, float] = {}  # push id -> when it was applied (kept one window)

    def push(
        self, replica_id: str, delta: StatsWindow, at: float, in_flight: int, queued: int, push_id: str | None = None
    ) -> bool:
        with self._lock:
            if push_id is not None:
                self._applied = {k: t for k, t in self._applied.items() if at - t <= self.window_s}
                if push_id in self._applied:
                    return False
                self._applied[push_id] = at
            self._ring.add(delta, at)
            self._costs.add(delta.deployment(), at)
            self._replicas[replica_id] = (in_flight, queued, at)
            return True

    def snapshot(self, now: float) -> LoadSnapshot:
        with self._lock:
            alive = [(f, q) for f, q, at in self._replicas.values() if now - at <= self.replica_ttl_s]
            window, costs = self._ring.recent(now), self._costs.recent(now)
        in_flight = sum(f for f, _ in alive)
        queued = sum(q for _, q in alive)
        return LoadSnapshot.from_window(window, self.window_s, in_flight, queued, measured_at=now, deployment=costs,
                                        replicas=len(alive))

    def switch_state(self) -> SwitchState:
        with self._lock:
            return self._switch

    def compare_and_set_switch(self, expected: SwitchState, new: SwitchState) -> bool:
        with self._lock:
            if self._switch != expected:
                return False
            self._switch = new
            return True
