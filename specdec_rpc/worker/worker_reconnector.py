"""WorkerReconnector: find a worker again after it went down, in the background.

A remote client whose worker stopped answering (killed, restarted elsewhere by its
supervisor) must not pay a failing call every round, and must notice when a worker is back,
possibly at another address. The reconnector does that on a daemon thread: it asks
`resolve()` for the worker's current address (the supervisor's answer, or simply the old
address; None = it is being restarted, "" = there is none and none is coming: `gone`), probes it
(`probe(address)` raises while nothing serves there) and hands the
first address that answers to `on_found(address)`; between tries it waits with exponential
backoff (`backoff_s` doubling up to `max_backoff_s`). `trigger()` starts a search; the
client keeps serving without the worker meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class WorkerReconnector:
    """Searches for a worker that is down until one answers (one search at a time)."""

    def __init__(
        self,
        resolve: Callable[[], str | None],
        probe: Callable[[str], None],
        on_found: Callable[[str], None],
        backoff_s: float = 0.25,
        max_backoff_s: float = 1.0,
    ) -> None:
        """resolve(): the worker's address now, or None when none is known (still restarting);
        probe(address): returns when a worker answers there, raises otherwise;
        on_found(address): called once per search, from the search thread."""
        self._resolve, self._probe, self._on_found = resolve, probe, on_found
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.searches = 0  # searches started
        self.last_error: str | None = None  # why the last try found nothing
        self.gone = False  # the last answer of resolve() was "": no worker is coming
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def searching(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def trigger(self) -> bool:
        """Start a search unless one runs (or the reconnector is closed); True when started."""
        with self._lock:
            if self._stop.is_set() or self.searching:
                return False
            self.gone = False  # until this search's first answer says otherwise
            self.searches += 1
            self._thread = threading.Thread(target=self._search, name="worker-reconnect", daemon=True)
            self._thread.start()
            return True

    def _search(self) -> None:
        wait = self.backoff_s
        while not self._stop.wait(wait):
            address = self._try_once()
            if address is not None:
                self._on_found(address)
                return
            wait = min(2 * wait, self.max_backoff_s)

    def _try_once(self) -> str | None:
        """One resolve + probe; the address that answered, or None (the reason in last_error)."""
        try:
            address = self._resolve()
            self.gone = address == ""
            if not address:
                self.last_error = "no worker (stopped)" if self.gone else "no worker address yet (restarting)"
                return None
            self._probe(address)
        except Exception as exc:  # noqa: BLE001 - anything: try again after the backoff
            self.last_error = _describe(exc)
            return None
        self.last_error = None
        return address

    def close(self) -> None:
        """Stop searching (waits briefly for the search thread)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)


def _describe(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    if callable(code):
        return f"{code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
