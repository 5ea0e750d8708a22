"""DraftKeeper: keeps one draft worker actor serving, restarting it when it dies.

The draft is only an optimisation, so losing it must cost speculation for a while, never
a request: routers go on target-only (RemoteProposer) and ask `address()` for the new
worker. A watcher thread waits on the actor's `until_stopped()` call, which ends with an
error when the actor's process dies; then the keeper starts a new draft worker, retrying
load failures with exponential backoff (`WorkerKeeper._recover`), each failure logged and
kept in `down_reason`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError

from actors.worker_keeper import WorkerKeeper
from specdec.config.config import SpecdecConfig

logger = logging.getLogger(__name__)

WATCH_PERIOD_S = 1.0  # how often the watcher looks up from waiting (to notice stop())


class DraftKeeper(WorkerKeeper):
    """start() the draft worker; a watcher restarts it after it dies until stop()."""

    NAME = "draft worker"

    def __init__(self, config: SpecdecConfig, start: Callable[[SpecdecConfig], tuple[Any, str]] | None = None) -> None:
        """start(config) -> (actor, address): how to start one draft worker (the default: start_draft_worker)."""
        from actors.draft_worker import start_draft_worker

        super().__init__(config)
        self._start = start or start_draft_worker
        self.actor: Any = None

    def start(self) -> str:
        """Start the first draft worker (a load failure raises) and the watcher; returns its address."""
        self.actor, self._address = self._start(self.config)
        self._start_watcher(self._watch)
        return self._address

    def _watch(self) -> None:
        while not self._stop.is_set():
            stopped = self.actor.until_stopped.remote()
            while not self._stop.is_set() and not ray.wait([stopped], timeout=WATCH_PERIOD_S)[0]:
                pass
            if self._stop.is_set():
                return
            try:
                ray.get(stopped)
                return  # stopped on purpose
            except RayError as exc:
                self._recover(f"the draft worker died ({type(exc).__name__})", self._restart)

    def _restart(self) -> str | None:
        """One new draft worker; None (and none kept) when stop() came meanwhile."""
        actor, address = self._start(self.config)
        with self._lock:
            if self._stop.is_set():
                ray.kill(actor)
                return None
            self.actor = actor
        return address

    def stop(self) -> None:
        """Stop watching, stop and kill the draft worker (idempotent)."""
        self._stop.set()
        with self._lock:
            actor, self.actor, self._address = self.actor, None, None
        if actor is not None:
            try:
                ray.get(actor.stop.remote(), timeout=10)
            except Exception as exc:  # noqa: BLE001 - it is being killed anyway
                logger.warning("draft worker did not stop cleanly: %s", exc)
            ray.kill(actor)
        self._join_watcher(WATCH_PERIOD_S + 5)
