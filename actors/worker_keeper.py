"""What the draft's and the target's keepers share: the serving address, how often and why
the worker went down, a stop event, and the recovery loop.

`_recover(why, attempt)` marks the worker down, then calls `attempt()` (start a new
worker; returns its address, or None when it found the keeper stopping) until one
serves or `stop()`, waiting `RESTART_BACKOFF_S` after a failure and doubling it up to
`MAX_RESTART_BACKOFF_S`; each failure is logged and kept in `down_reason`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from specdec.config.config import SpecdecConfig

logger = logging.getLogger(__name__)

RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0


class WorkerKeeper:
    NAME = "worker"  # in log lines: "<NAME> back at <address> in <s>"

    def __init__(self, config: SpecdecConfig) -> None:
        self.config = config
        self._address: str | None = None
        self.restarts = 0  # workers (groups) started after the first one died
        self.down_reason: str | None = None  # why none serves now (None while one serves)
        self.last_recovery_s: float | None = None  # death noticed -> a new one serving, seconds, last time
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def address(self) -> str | None:
        """The serving worker's 'ip:port', or None while it is being replaced."""
        return self._address

    def status(self) -> dict[str, Any]:
        return {"address": self._address, "restarts": self.restarts, "down_reason": self.down_reason,
                "last_recovery_s": self.last_recovery_s}

    def _start_watcher(self, watch: Callable[[], None]) -> None:
        self._watcher = threading.Thread(target=watch, name=f"{self.NAME}-keeper", daemon=True)
        self._watcher.start()

    def _join_watcher(self, timeout_s: float) -> None:
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=timeout_s)

    def _recover(self, why: str, attempt: Callable[[], str | None]) -> None:
        """Replace the dead worker: attempt() until one serves (backoff) or stop()."""
        noticed = time.monotonic()
        self._address, self.down_reason = None, why
        logger.warning("%s: replacing the %s", why, self.NAME)
        backoff = RESTART_BACKOFF_S
        while not self._stop.is_set():
            try:
                address = attempt()
            except Exception as exc:  # noqa: BLE001 - reported, retried
                self.down_reason = f"{why}; replacing it failed: {type(exc).__name__}: {exc}"
                logger.warning("%s (retry in %.0fs)", self.down_reason, backoff)
                self._stop.wait(backoff)
                backoff = min(2 * backoff, MAX_RESTART_BACKOFF_S)
                continue
            if address is None:  # stopping
                return
            self._address, self.down_reason = address, None
            self.restarts += 1
            self.last_recovery_s = time.monotonic() - noticed
            logger.warning("%s back at %s in %.1fs", self.NAME, address, self.last_recovery_s)
            return
