"""TargetKeeper: keeps the tensor-parallel target group serving, re-forming it when a rank dies.

A rank that dies leaves the others unable to run a forward (every layer all-reduces across
all of them), so the whole group is re-formed: every rank is stopped, the placement group
released, and a new group started (new ranks, a new torch.distributed group, the shards
loaded again), retrying with exponential backoff. Routers wait for it (RemoteVerifier's
recovery) and re-prefill their in-flight sequences from their own token histories, so
those requests finish with the output they would have had, after a pause.

A watcher thread keeps a heartbeat on every rank (`RankHeartbeat`): one `__ray_ready__` ping
outstanding per rank, a new one each `WATCH_PERIOD_S` after the last was answered. A dead
rank's answer is an error at once. A busy rank answers late (a follower between two forwards,
the leader between two events of its loop), which is not taken for death; a rank whose ping
has waited `serving.target_hang_s` is taken for hung (alive but stuck: SIGSTOPped, a wedged
device, a collective that never completes; the ranks still running then block in their
all-reduce) and the group is re-formed just like after a death, without the leader's orderly
stop (it cannot stop cleanly). Routers' calls to the stuck group time out after
`serving.worker_timeout_s` and wait for the new one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.target_group import TargetGroup
from actors.worker_keeper import WorkerKeeper
from specdec.config.config import SpecdecConfig

WATCH_PERIOD_S = 1.0
READY_TIMEOUT_S = 2.0  # one look at the outstanding pings waits at most this long


class TargetKeeper(WorkerKeeper):
    """start() the group; a watcher re-forms it after a rank dies, until stop()."""

    NAME = "target group"

    def __init__(self, config: SpecdecConfig, report: Callable[[str], None] | None = None) -> None:
        super().__init__(config)
        self.report = report
        self.group: TargetGroup | None = None

    def start(self) -> str:
        """Start the group (a failure raises, releasing what it made) and the watcher."""
        group = TargetGroup(self.config, report=self.report)
        self._address = group.start()
        self.group = group
        self._start_watcher(self._watch)
        return self._address

    def _watch(self) -> None:
        heartbeat = RankHeartbeat(self.config.serving.target_hang_s)
        while not self._stop.wait(WATCH_PERIOD_S):
            group = self.group
            if group is None or group.leader is None:
                continue  # being (re-)formed
            problem = heartbeat.check(group, [group.leader, *group.followers])
            if problem is not None and not self._stop.is_set():
                why, hung = problem
                # _recover calls the lambda before the loop goes on: it sees this round's hung
                self._recover(why, lambda: self._reform(orderly=not hung))  # noqa: B023

    def _reform(self, orderly: bool = True) -> str:
        """Stop every rank, release the placement group, start a new group; its leader's address.
        orderly=False: kill the ranks at once (a hung group's leader cannot stop cleanly)."""
        with self._lock:
            if self.group is not None:
                self.group.shutdown(orderly=orderly)
            group = self.group = TargetGroup(self.config, report=self.report)
        return group.start()

    def info(self) -> dict[str, Any]:
        if self.group is None:
            raise RuntimeError("the target group is not started")
        return self.group.info()

    def stop(self) -> None:
        """Stop watching and shut the group down (idempotent)."""
        self._stop.set()
        self._join_watcher(WATCH_PERIOD_S + READY_TIMEOUT_S + 5)
        with self._lock:
            group, self.group, self._address = self.group, None, None
        if group is not None:
            group.shutdown()


class RankHeartbeat:
    """One outstanding `__ray_ready__` ping per rank of one group, and when it was sent.

    check() looks at the answers (waiting up to READY_TIMEOUT_S) and pings again every rank
    that answered. A rank whose ping is older than hang_s is hung; a rank whose ping failed
    with RayActorError died. Pings of an earlier group are dropped.
    """

    def __init__(self, hang_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hang_s = hang_s
        self._clock = clock
        self._group: Any = None
        self._pings: dict[int, tuple[Any, float]] = {}  # rank -> (ref, sent at)

    def check(self, group: Any, ranks: list[Any]) -> tuple[str, bool] | None:
        """None while every rank answers; else (why, hung): a rank died (False) or hung (True)."""
        if group is not self._group:
            self._group, self._pings = group, {}
        for i, rank in enumerate(ranks):
            if i not in self._pings:
                self._pings[i] = (rank.__ray_ready__.remote(), self._clock())
        refs = [ref for ref, _ in self._pings.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        ready = set(ready)
        now = self._clock()
        for i, (ref, sent) in sorted(self._pings.items()):
            if ref in ready:
                del self._pings[i]  # answered: pinged again next time
                try:
                    ray.get(ref)
                except RayActorError as exc:
                    return f"target rank {i} died ({type(exc).__name__})", False
            elif now - sent >= self.hang_s:
                return f"target rank {i} hung (no answer to the heartbeat for {now - sent:.0f}s)", True
        return None
