"""LoadMonitor: the engine's round policy, backed by a shared LoadStore, never on the request path.

The engine thread only touches memory: `plan` reads a cached snapshot, `record` and
`on_arrival` add to a pending delta. A background thread (`tick`, every ~100 ms) pushes the
delta to the store in one batch, refreshes the snapshot, and feeds the operator's load
switch when one is configured (shared by all replicas). Without a store and without the
thread (the in-process engine), `record` ticks inline: memory only, as cheap.
A circuit breaker stops calling a failing store; meanwhile decisions use this replica's own
measurements (always kept locally), and the shared store is used again once it answers.
Pushes are idempotent: each batch keeps its id and time, and a batch whose push failed (or
timed out after the store had executed it) is retried as is, so it counts once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from specdec.policy.circuit_breaker import CircuitBreaker
from specdec.config.config import LoadMonitorConfig
from specdec.policy.load_stats import LoadSnapshot, RoundSample, StatsWindow
from specdec.policy.load_store import InProcessLoadStore, LoadStore, SwitchState
from specdec.policy.policy_status import PolicyStatus
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import Crossover, Decision, SpeculationPolicy
from specdec.requests.speculation_mode import SpeculationMode

log = logging.getLogger(__name__)
CROSSOVER_REFRESH_S = 1.0


class LoadMonitor:
    def __init__(
        self,
        store: LoadStore | None,
        policy: SpeculationPolicy,
        replica_id: str,
        refresh_s: float = 0.1,
        window_s: float = 10.0,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.time,
        cost_window_s: float | None = None,
        bucket_s: float = 1.0,
    ) -> None:
        """store: the shared store (None = this process only); window_s / cost_window_s:
        this replica's own measurements (the fallback), as the store keeps them, in buckets of bucket_s."""
        self.store = store
        self.local = InProcessLoadStore(window_s=window_s, bucket_s=bucket_s, cost_window_s=cost_window_s)
        self.policy = policy
        self.replica_id = replica_id
        self.refresh_s = refresh_s
        self.window_s = window_s
        self.breaker = breaker or CircuitBreaker()
        self.clock = clock
        self._lock = threading.Lock()
        self._pending = StatsWindow()
        self._unsent: list[tuple[str, StatsWindow, float]] = []  # (push id, delta, time) not yet acknowledged
        self._push_ids = itertools.count()
        self._load = (0, 0)
        self._snapshot: LoadSnapshot | None = None
        self._last_tick = float("-inf")
        self._default_gamma = policy.settings.fallback_gamma  # the server's γ, as the engine last said
        self._crossover: tuple[float, Crossover] | None = None  # (when, value): dear to compute, so reused
        self.source = "local" if store is None else "shared"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- request path (memory only) -------------------------------------------------------

    def on_arrival(self, count: int = 1) -> None:
        with self._lock:
            self._pending.add_arrival(count)

    def set_load(self, in_flight: int, queued: int) -> None:
        self._load = (in_flight, queued)

    def plan(self, rows: list[RowState], default_gamma: int, ahead: Decision | None = None) -> Decision:
        """Each row's γ for this round (the engine thread); ahead: `plan_ahead`'s plan for
        these rows, taken where it still holds (`SpeculationPolicy.plan`)."""
        self._default_gamma = default_gamma
        return self.policy.plan(self._snapshot, rows, self.clock(), default_gamma, ahead=ahead)

    def plan_ahead(self, rows: list[RowState], default_gamma: int) -> Decision:
        """The plan for these rows from the snapshot now, counting no round (no exploration,
        no state moved): made off the engine's critical path, while the target verifies the
        round these rows are in, for the round after it (`RoundPlanner`)."""
        return self.policy.plan(self._snapshot, rows, self.clock(), default_gamma, update_state=False)

    def record(self, sample: RoundSample) -> None:
        with self._lock:
            self._pending.add_round(sample)
        if self.store is None and self._thread is None and self.clock() - self._last_tick >= self.refresh_s:
            self.tick()  # in-process: no thread, memory only

    @property
    def snapshot(self) -> LoadSnapshot | None:
        return self._snapshot

    # ---- background ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Push the pending delta, refresh the snapshot and update the shared switch."""
        now = self._last_tick = self.clock()
        with self._lock:
            delta, self._pending = self._pending, StatsWindow()
        in_flight, queued = self._load
        self.local.push(self.replica_id, delta, now, in_flight, queued)
        batch = (f"{self.replica_id}:{next(self._push_ids)}", delta, now)
        shared = self._tick_shared(batch, now, in_flight, queued) if self.store is not None else False
        if not shared:
            self._update(self.local, self.local.snapshot(now), now)

    def _tick_shared(self, batch: tuple[str, StatsWindow, float], now: float, in_flight: int, queued: int) -> bool:
        """Push the unacknowledged batches (oldest first, each with its own id and time, so a
        retry counts once), then this tick's; refresh the snapshot from the store."""
        self._unsent = [b for b in self._unsent if now - b[2] <= self.window_s] + [batch]
        if not self.breaker.allow(now):
            return False
        try:
            while self._unsent:
                push_id, delta, at = self._unsent[0]
                self.store.push(self.replica_id, delta, at, in_flight, queued, push_id=push_id)
                self._unsent.pop(0)
            self._update(self.store, self.store.snapshot(now), now)
        except Exception as exc:  # any store failure: fall back to local, retry later
            self.breaker.record_failure(now)
            if self.source != "local":
                log.warning("load store unreachable (%s); using local measurements", exc)
            self.source = "local"
            return False
        if self.source != "shared":
            log.info("load store reachable again; using shared measurements")
        self.breaker.record_success()
        self.source = "shared"
        return True

    def _update(self, store: LoadStore, snapshot: LoadSnapshot, now: float) -> None:
        """Take the fresh snapshot and move the on/off state. The operator's switch is shared
        by all replicas (one replica's change wins: CAS); the plan's is each replica's own
        (it depends on the replica's batch)."""
        self._snapshot = snapshot
        switch, shared = self.policy.switch, self.policy.settings.thresholds is not None
        if shared:
            state = store.switch_state()
            switch.enabled, switch.since = state.enabled, state.since
        self.policy.update_switch(snapshot, self._switch_rows(snapshot), now)
        if not shared:
            return
        new = SwitchState(switch.enabled, switch.since)
        if new != state and not store.compare_and_set_switch(state, new):
            latest = store.switch_state()
            switch.enabled, switch.since = latest.enabled, latest.since

    def _switch_rows(self, snapshot: LoadSnapshot) -> int:
        """The batch the on/off state is decided at: the rows the window's demand keeps in
        flight (`SpeculationPolicy.steady_rows`); while requests queue for a slot, or before
        the cost model is measured, the window's mean rows per round (else the requests
        running now). The running count itself is no guide: at 1 request/s it moves between 0
        and 4 from one second to the next, and followed, it switched speculation off for a
        dwell time at every passing 3-row moment."""
        batch = max(1, round(snapshot.mean_batch)) if snapshot.mean_batch > 0 else self._load[0]
        steady = self.policy.steady_rows(snapshot)
        if steady is None:
            return batch
        return max(steady, batch) if snapshot.queued > 0 else steady

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specdec-load-monitor", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.tick()
            except Exception:  # never let the monitor die
                log.exception("load monitor tick failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def status(self) -> PolicyStatus:
        """The live picture for GetStats / `specdec status` and the metrics."""
        snap, crossover = self._snapshot, self.crossover()
        decision = self.preview()
        return PolicyStatus(
            source=self.source,
            breaker=self.breaker.state(self.clock()),
            speculation_enabled=decision.enabled,
            gamma=decision.gamma,
            reason=decision.reason,
            off_because_of_load=self._off_because_of_load(decision, crossover),
            crossover=crossover,
            round_cost=self.policy.remembered(snap).round_cost if snap else None,  # the one the plan uses
            qps=snap.qps if snap else 0.0,
            in_flight=snap.in_flight if snap else 0.0,
            queued=snap.queued if snap else 0.0,
            alpha=snap.alpha if snap else None,
            mean_accepted_length=snap.mean_accepted_length if snap else None,
            alpha_per_position=tuple(snap.alpha_per_position) if snap else (),
        )

    def preview(self) -> Decision:
        """What the plan gives AUTO requests now, at the current number of running requests
        (at least one), without moving the on/off state."""
        rows = [RowState(SpeculationMode.AUTO, None, self.policy.settings.gamma_max, seq_id=f"preview-{i}")
                for i in range(max(1, self._load[0]))]
        return self.policy.plan(self._snapshot, rows, self.clock(), self._default_gamma, update_state=False)

    def crossover(self) -> Crossover:
        """The policy's crossover, recomputed at most once per second (it plans batches of
        up to 256 rows: in a router process that would hold the GIL from the rounds)."""
        now = self.clock()
        if self._crossover is None or now - self._crossover[0] >= CROSSOVER_REFRESH_S:
            self._crossover = (now, self.policy.crossover(self._snapshot))
        return self._crossover[1]

    def _off_because_of_load(self, decision: Decision, crossover: Crossover) -> bool:
        """Off while a lone request would speculate: the batch is past the crossover, or the
        operator's load switch is off."""
        if not decision.enabled and self.policy.settings.thresholds is not None:
            return True
        return decision.gamma == 0 and crossover.rows is not None and crossover.rows > 1 \
            and len(decision.gammas) >= crossover.rows


def build_load_monitor(config: LoadMonitorConfig, store: LoadStore | None, replica_id: str) -> LoadMonitor:
    """A LoadMonitor with the policy, switch and breaker that `config` describes."""
    settings = PolicySettings.from_config(config)
    breaker = CircuitBreaker(config.breaker_failures, config.breaker_reset_s)
    return LoadMonitor(store, SpeculationPolicy(settings), replica_id, config.refresh_s, config.window_s, breaker,
                       cost_window_s=config.cost_window_s, bucket_s=config.bucket_s)
