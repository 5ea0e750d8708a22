"""Work that waits until the next round's first request is on its way to a worker.

A round's outputs are handed to their streams' event loops when the round ends. In one Python
process a woken loop takes the GIL from whoever needs it next, and right after a round ends
that is the next round's request: built on the engine's thread, then serialised and written
by gRPC's sending thread. In the served router the woken side is long (the stream's loop, Ray
Serve's loop, the public stream's gRPC send), so the hand-over ran on the round's critical
path, ahead of the worker's call. `AsyncEngine(defer_handoff=True)` parks each round's
hand-over here instead; it runs as soon as a round stream has written a request (the sending
thread asks its request iterator for the next one: `request_sent`), while the worker computes,
or at the engine thread's next safe point, whichever comes first (`Once`: never twice).

Process-wide on purpose: running any engine's parked hand-over early is what would have
happened without parking it, so a request written by any round stream may run them all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_parked: list["Once"] = []


class Once:
    """`fn`, run at most once by whichever thread calls first; a caller that comes while it
    runs waits until it ran (so what its caller does next follows it)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            self._fn()

    @property
    def done(self) -> bool:
        return self._done


def park(fn: Callable[[], None]) -> Once:
    """Run `fn` once a round stream wrote its next request (or when the returned Once is called)."""
    once = Once(fn)
    with _lock:
        _parked[:] = [o for o in _parked if not o.done]  # run meanwhile by their engine thread
        _parked.append(once)
    return once


def request_sent() -> None:
    """(a round stream's sending thread, after writing a request) Run the parked work, in the
    order it was parked. Never raises: the caller is gRPC's request iterator."""
    with _lock:
        taken = _parked[:]
        _parked.clear()
    for once in taken:
        try:
            once()
        except Exception:  # noqa: BLE001 - a failed hand-over must not end the worker's stream
            logger.exception("a parked hand-over failed")
