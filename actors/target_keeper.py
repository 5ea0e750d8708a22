"""TargetKeeper: keeps the tensor-parallel target group serving, re-forming it when a rank dies.

A rank that dies leaves the others unable to run a forward (every layer all-reduces across
all of them), so the whole group is re-formed: every rank is stopped, the placement group
released, and a new group started (new ranks, a new torch.distributed group, the shards
loaded again), retrying with exponential backoff. Routers wait for it (RemoteVerifier's
recovery) and re-prefill their in-flight sequences from their own token histories, so
those requests finish with the output they would have had, after a pause.

A watcher thread asks every rank for `__ray_ready__` each `WATCH_PERIOD_S`: a dead rank's
answer is an error at once; a busy rank's is late, which is not taken for death.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.target_group import TargetGroup
from actors.worker_keeper import WorkerKeeper
from specdec.config import SpecdecConfig

WATCH_PERIOD_S = 1.0
READY_TIMEOUT_S = 2.0


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
        while not self._stop.wait(WATCH_PERIOD_S):
            dead = self._dead_rank()
            if dead is not None and not self._stop.is_set():
                self._recover(f"target rank {dead} died", self._reform)

    def _dead_rank(self) -> int | None:
        group = self.group
        if group is None or group.leader is None:
            return None
        ranks = [group.leader, *group.followers]
        refs = [rank.__ray_ready__.remote() for rank in ranks]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        for i, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except RayActorError:
                    return i
        return None

    def _reform(self) -> str:
        """Stop every rank, release the placement group, start a new group; its leader's address."""
        with self._lock:
            if self.group is not None:
                self.group.shutdown()
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
