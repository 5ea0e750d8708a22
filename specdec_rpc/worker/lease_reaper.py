"""LeaseReaper: the worker side of leases (see worker.proto): renew on every call, free lapsed ones.

Each servicer (draft, target) owns one. A call runs inside `call(lease_id)`, which renews
the lease and keeps it alive while the call runs (also while it waits for the worker's
lock); the sequences a call applies are recorded with `hold`, released ones with
`released`. A background task on the server's event loop wakes every `period_s` (a quarter
of the TTL, at most 1 s); when a lease has lapsed it takes the worker's lock and frees that
lease's sequences on the worker thread with the servicer's own release function. So the
slots of a router that died are free within ttl_s + period_s.

The table is only touched on the event loop (never from the worker thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from specdec.config.config import ServingConfig
from specdec.serving.lease_table import LeaseTable
from specdec_rpc.worker.worker_runtime import SerialExecutor

logger = logging.getLogger(__name__)

MAX_PERIOD_S = 1.0
DEFAULT_LEASE_TTL_S: float = ServingConfig.model_fields["lease_ttl_s"].default


class LeaseReaper:
    """Leases of one worker, and the task that frees the slots of lapsed ones."""

    def __init__(
        self,
        ttl_s: float,
        work: SerialExecutor,
        free: Callable[[list[str]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """free(seq_ids): frees those sequences' slots and histories (runs on the worker thread)."""
        self.table = LeaseTable(ttl_s, clock)
        self.period_s = min(MAX_PERIOD_S, ttl_s / 4)
        self._work = work
        self._free = free
        self._task: asyncio.Task | None = None

    @property
    def ttl_s(self) -> float:
        return self.table.ttl_s

    @contextlib.contextmanager
    def call(self, lease_id: str) -> Iterator[None]:
        """Around a whole call: the lease lives while it runs and is renewed when it ends."""
        self.table.call_started(lease_id)
        try:
            yield
        finally:
            self.table.call_ended(lease_id)

    def hold(self, lease_id: str, seq_ids: Iterable[str]) -> None:
        """The call's sequences are held under its lease now."""
        self.table.hold(lease_id, seq_ids)

    def released(self, seq_ids: Iterable[str]) -> None:
        """The sequences were freed by their router."""
        self.table.release(seq_ids)

    def keep_alive(self, lease_id: str) -> int:
        """Renew a lease (creating it if unknown); returns how many sequences it holds."""
        self.table.renew(lease_id)
        return len(self.table.held(lease_id))

    def info_fields(self) -> dict[str, float | int]:
        """The lease fields of WorkerInfo."""
        return {"lease_ttl_s": self.ttl_s, "leases": len(self.table), "expired_sequences": self.table.expired_sequences}

    async def reap(self) -> int:
        """Free the sequences of every lapsed lease now; returns how many were freed."""
        if not self.table.lapsed():
            return 0  # the usual case: no need to wait for the worker's lock
        async with self._work.lock:
            expired = self.table.expire()
            seq_ids = sorted(seq_id for held in expired.values() for seq_id in held)
            if seq_ids:
                logger.warning(
                    "lease(s) %s not renewed for %.1fs: freeing their %d sequence(s)",
                    sorted(lease for lease, held in expired.items() if held), self.ttl_s, len(seq_ids),
                )
                await self._work.run(self._free, seq_ids)
        return len(seq_ids)

    def start(self) -> None:
        """Start reaping on the running event loop (the server's)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lease-reaper")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.reap()
            except Exception:  # noqa: BLE001 - the reaper must outlive one failed release
                logger.exception("freeing the sequences of lapsed leases failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
