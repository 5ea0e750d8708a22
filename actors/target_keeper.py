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

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.target_group import TargetGroup
from specdec.config import SpecdecConfig

logger = logging.getLogger(__name__)

WATCH_PERIOD_S = 1.0
READY_TIMEOUT_S = 2.0
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0


class TargetKeeper:
    """start() the group; a watcher re-forms it after a rank dies, until stop()."""

    def __init__(self, config: SpecdecConfig, report: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.report = report
        self.group: TargetGroup | None = None
        self._address: str | None = None
        self.restarts = 0  # groups re-formed after a rank died
        self.down_reason: str | None = None
        self.last_recovery_s: float | None = None  # rank death noticed -> new group serving, seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def address(self) -> str | None:
        """The leader's 'ip:port', or None while the group is being re-formed."""
        return self._address

    def start(self) -> str:
        """Start the group (a failure raises, releasing what it made) and the watcher."""
        group = TargetGroup(self.config, report=self.report)
        self._address = group.start()
        self.group = group
        self._watcher = threading.Thread(target=self._watch, name="target-keeper", daemon=True)
        self._watcher.start()
        return self._address

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_PERIOD_S):
            dead = self._dead_rank()
            if dead is not None and not self._stop.is_set():
                self._reform(f"target rank {dead} died")

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

    def _reform(self, why: str) -> None:
        """Stop every rank, release the placement group, start a new group (with backoff)."""
        noticed = time.monotonic()
        self._address, self.down_reason = None, why
        logger.warning("%s: re-forming the target group", why)
        backoff = RESTART_BACKOFF_S
        while not self._stop.is_set():
            with self._lock:
                if self.group is not None:
                    self.group.shutdown()
                group = self.group = TargetGroup(self.config, report=self.report)
            try:
                address = group.start()
            except Exception as exc:  # noqa: BLE001 - reported, retried
                self.down_reason = f"{why}; re-forming failed: {type(exc).__name__}: {exc}"
                logger.warning("%s (retry in %.0fs)", self.down_reason, backoff)
                self._stop.wait(backoff)
                backoff = min(2 * backoff, MAX_RESTART_BACKOFF_S)
                continue
            self._address, self.down_reason = address, None
            self.restarts += 1
            self.last_recovery_s = time.monotonic() - noticed
            logger.warning("target group re-formed at %s in %.1fs", address, self.last_recovery_s)
            return

    def info(self) -> dict[str, Any]:
        if self.group is None:
            raise RuntimeError("the target group is not started")
        return self.group.info()

    def status(self) -> dict[str, Any]:
        return {"address": self._address, "restarts": self.restarts, "down_reason": self.down_reason,
                "last_recovery_s": self.last_recovery_s}

    def stop(self) -> None:
        """Stop watching and shut the group down (idempotent)."""
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=WATCH_PERIOD_S + READY_TIMEOUT_S + 5)
        with self._lock:
            group, self.group, self._address = self.group, None, None
        if group is not None:
            group.shutdown()
