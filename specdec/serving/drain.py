"""Draining a server before it stops: stop admitting, let in-flight requests finish within a
grace period, end the rest, release the engine.

What SIGTERM / SIGINT of `specdec serve` (and a Kubernetes preStop hook) start in each
router. From the moment the drain begins, new requests are refused as unavailable (gRPC
UNAVAILABLE, HTTP 503: a client retries elsewhere) and health reports NOT_SERVING; requests
already admitted keep running. Those still running after `grace_s` end with
EngineClosedError (UNAVAILABLE / an SSE error event), never a silent cut. Then the engine
loop stops, which releases the workers' slots. Draining twice waits for the same drain.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

from specdec.serving.frontend import Frontend

SHUTTING_DOWN = "the server is shutting down"
POLL_S = 0.05
LOOP_STOP_S = 10.0


@dataclass(frozen=True)
class DrainReport:
    """in_flight: requests admitted when the drain began; cancelled: those still running at
    the end of the grace period (ended as unavailable); waited_s: how long it waited."""

    in_flight: int
    cancelled: int
    waited_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Drain:
    """The drain of one frontend (one router replica)."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self._task: asyncio.Task | None = None

    @property
    def finished(self) -> bool:
        """True once a drain has run to its end (the engine loop stopped): this frontend serves
        nothing any more."""
        return self._task is not None and self._task.done()

    async def run(self, grace_s: float) -> DrainReport:
        """Drain (once; a second call waits for the first) and report."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._drain(grace_s))
        return await asyncio.shield(self._task)

    async def _drain(self, grace_s: float) -> DrainReport:
        self.frontend.closing = SHUTTING_DOWN  # from now on: NotReadyError, health NOT_SERVING
        served = self.frontend.served
        started = time.monotonic()
        if served is None:
            return DrainReport(0, 0, 0.0)
        in_flight = served.loop.num_requests
        deadline = started + grace_s
        while served.loop.num_requests and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        cancelled = served.loop.num_requests
        # ends what is left (and what slipped in while being tokenised) with EngineClosedError
        await asyncio.to_thread(served.loop.shutdown, LOOP_STOP_S)
        return DrainReport(in_flight, cancelled, time.monotonic() - started)
