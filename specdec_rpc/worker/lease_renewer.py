"""LeaseRenewer: the router side of leases (see worker.proto): keep one lease alive on one worker.

Each remote client of a worker (RemoteProposer, RemoteVerifier) holds one. The client's
calls renew the lease on the worker by themselves (`touch()` records when one was sent);
a daemon thread sends a KeepAlive whenever the client has been silent for a third of the
worker's TTL (the worker states its TTL in every KeepAlive answer). So the sequences a
router still holds survive stretches without calls to that worker, e.g. many rounds with
speculation off (no Propose), while a router that dies simply stops renewing.

A failed keep-alive is logged once and retried on the next tick: if the worker is gone,
the client's next real call reports it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

logger = logging.getLogger(__name__)


def new_lease_id() -> str:
    """A lease id no other router (or restart of this one) uses: host, process, random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class LeaseRenewer:
    """Sends KeepAlive for one lease when its client has made no call for ttl_s / 3 seconds."""

    def __init__(
        self,
        lease_id: str,
        keep_alive: Callable[[str], float],
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """keep_alive(lease_id): sends one KeepAlive and returns the worker's TTL (0 = unknown);
        raises when it fails. ttl_s: the TTL assumed until the worker states its own."""
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.keep_alives = 0  # KeepAlive calls that succeeded
        self._keep_alive = keep_alive
        self._clock = clock
        self._last = clock()
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def period_s(self) -> float:
        """The longest silence before a keep-alive is due."""
        return self.ttl_s / 3

    def touch(self) -> None:
        """A call was just sent to the worker: it renews the lease."""
        self._last = self._clock()

    def renew_if_due(self) -> bool:
        """Send a KeepAlive if the client has been silent for period_s; True when one was sent."""
        if self._clock() - self._last < self.period_s:
            return False
        try:
            ttl_s = self._keep_alive(self.lease_id)
        except Exception as exc:  # noqa: BLE001 - any failure: try again on the next tick
            if not self._failing:
                logger.warning("lease %s: keep-alive failed (will retry): %s", self.lease_id, _describe(exc))
            self._failing = True
            return False
        self._failing = False
        self.ttl_s = ttl_s if ttl_s > 0 else self.ttl_s
        self.keep_alives += 1
        self.touch()
        return True

    def start(self) -> "LeaseRenewer":
        """Start the daemon thread that checks every period_s / 2 (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"lease-{self.lease_id}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s / 2):
            self.renew_if_due()

    def close(self) -> None:
        """Stop renewing (the worker frees whatever the lease still holds after its TTL)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


def _describe(exc: Exception) -> str:
    """One line: a gRPC error's code and details, else the exception's type and text."""
    code = getattr(exc, "code", None)
    if callable(code):
        return f"{code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
