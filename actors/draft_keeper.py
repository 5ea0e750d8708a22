"""DraftKeeper: keeps one draft worker actor serving, restarting it when it dies.

The draft is only an optimisation, so losing it must cost speculation for a while, never
a request: routers go on target-only (RemoteProposer) and ask `address()` for the new
worker. A watcher thread waits on the actor's `until_stopped()` call, which ends with an
error when the actor's process dies; then the keeper starts a new draft worker, retrying
load failures with exponential backoff (`RESTART_BACKOFF_S` doubling up to
`MAX_RESTART_BACKOFF_S`), each failure logged and kept in `down_reason`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError

from specdec.config import SpecdecConfig

logger = logging.getLogger(__name__)

RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0
WATCH_PERIOD_S = 1.0  # how often the watcher looks up from waiting (to notice stop())


class DraftKeeper:
    """start() the draft worker; a watcher restarts it after it dies until stop()."""

    def __init__(self, config: SpecdecConfig, start: Callable[[SpecdecConfig], tuple[Any, str]] | None = None) -> None:
        """start(config) -> (actor, address): how to start one draft worker (the default: start_draft_worker)."""
        from actors.draft_worker import start_draft_worker

        self.config = config
        self._start = start or start_draft_worker
        self.actor: Any = None
        self._address: str | None = None
        self.restarts = 0  # draft workers started after the first one died
        self.down_reason: str | None = None  # why there is no draft worker now (None while one serves)
        self.last_recovery_s: float | None = None  # death -> new worker serving, seconds, last time
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def address(self) -> str | None:
        """The serving draft worker's 'ip:port', or None while it is being restarted."""
        return self._address

    def start(self) -> str:
        """Start the first draft worker (a load failure raises) and the watcher; returns its address."""
        self.actor, self._address = self._start(self.config)
        self._watcher = threading.Thread(target=self._watch, name="draft-keeper", daemon=True)
        self._watcher.start()
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
                self._replace(f"the draft worker died ({type(exc).__name__})")

    def _replace(self, why: str) -> None:
        """Start a new draft worker, with backoff, until one serves or stop()."""
        died = time.monotonic()
        self._address, self.down_reason = None, why
        logger.warning("%s: restarting it", why)
        backoff = RESTART_BACKOFF_S
        while not self._stop.is_set():
            try:
                actor, address = self._start(self.config)
            except Exception as exc:  # noqa: BLE001 - reported, retried
                self.down_reason = f"{why}; restart failed: {type(exc).__name__}: {exc}"
                logger.warning("%s (retry in %.0fs)", self.down_reason, backoff)
                self._stop.wait(backoff)
                backoff = min(2 * backoff, MAX_RESTART_BACKOFF_S)
                continue
            with self._lock:
                if self._stop.is_set():
                    ray.kill(actor)
                    return
                self.actor, self._address, self.down_reason = actor, address, None
            self.restarts += 1
            self.last_recovery_s = time.monotonic() - died
            logger.warning("draft worker restarted at %s in %.1fs", address, self.last_recovery_s)
            return

    def status(self) -> dict[str, Any]:
        return {"address": self._address, "restarts": self.restarts, "down_reason": self.down_reason,
                "last_recovery_s": self.last_recovery_s}

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
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=WATCH_PERIOD_S + 5)
