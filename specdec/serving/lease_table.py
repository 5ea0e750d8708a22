"""LeaseTable: which sequences each router's lease holds on a worker, and which leases lapsed.

A worker's cache slots are taken by routers, which can die (a killed Ray Serve replica)
without releasing them. So every sequence a router opens is held under that router's
*lease* (its id travels with every worker call), and a lease lives only while it is
renewed: by every call the router makes, and by a cheap keep-alive while it makes none.
A lease not renewed for `ttl_s` seconds has lapsed; `expire()` hands the worker the
sequences it held, to free their slots.

A lease with a call in flight never lapses (a long prefill, or a call queued behind
others, must not lose its own slots); its clock restarts when the call ends. Expiring a
lease that is in fact alive is safe, only wasteful: the worker no longer knows its
sequences, answers their next delta with a resync, and the router sends the whole history.

Pure bookkeeping: the clock is injected, nothing runs in the background.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class _Lease:
    renewed_at: float
    calls_in_flight: int = 0
    seq_ids: set[str] = field(default_factory=set)


class LeaseTable:
    """Leases by id: when each was last renewed, its calls in flight, the sequences it holds."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._owner: dict[str, str] = {}  # seq_id -> lease_id holding it
        self.expired_sequences = 0  # sequences handed out by expire() so far

    def __len__(self) -> int:
        """Leases known (live, or lapsed but not yet expired)."""
        return len(self._leases)

    def __contains__(self, lease_id: str) -> bool:
        return lease_id in self._leases

    def held(self, lease_id: str) -> set[str]:
        """The sequences a lease holds (empty for an unknown lease)."""
        lease = self._leases.get(lease_id)
        return set(lease.seq_ids) if lease is not None else set()

    def renew(self, lease_id: str) -> None:
        """A sign of life from the lease's router (a keep-alive); creates the lease if new."""
        lease = self._leases.get(lease_id)
        if lease is None:
            self._leases[lease_id] = _Lease(self._clock())
        else:
            lease.renewed_at = self._clock()

    def call_started(self, lease_id: str) -> None:
        """A call of the lease arrived: renew it and keep it alive until call_ended."""
        self.renew(lease_id)
        self._leases[lease_id].calls_in_flight += 1

    def call_ended(self, lease_id: str) -> None:
        """The call finished (however it ended): renew the lease from now."""
        self.renew(lease_id)
        lease = self._leases[lease_id]
        lease.calls_in_flight = max(0, lease.calls_in_flight - 1)

    def hold(self, lease_id: str, seq_ids: Iterable[str]) -> None:
        """The lease holds these sequences now (a sequence held by another lease moves to it)."""
        self.renew(lease_id)
        lease = self._leases[lease_id]
        for seq_id in seq_ids:
            previous = self._owner.get(seq_id)
            if previous is not None and previous != lease_id:
                self._leases[previous].seq_ids.discard(seq_id)
            self._owner[seq_id] = lease_id
            lease.seq_ids.add(seq_id)

    def release(self, seq_ids: Iterable[str]) -> None:
        """The sequences were freed (released by their router); unknown ids are ignored."""
        for seq_id in seq_ids:
            lease_id = self._owner.pop(seq_id, None)
            if lease_id is not None:
                self._leases[lease_id].seq_ids.discard(seq_id)

    def lapsed(self) -> list[str]:
        """Ids of the leases not renewed within ttl_s and with no call in flight."""
        now = self._clock()
        return [
            lease_id
            for lease_id, lease in self._leases.items()
            if lease.calls_in_flight == 0 and now - lease.renewed_at > self.ttl_s
        ]

    def expire(self) -> dict[str, set[str]]:
        """Forget every lapsed lease; returns {lease_id: the sequences it held} (to free)."""
        expired = {}
        for lease_id in self.lapsed():
            lease = self._leases.pop(lease_id)
            for seq_id in lease.seq_ids:
                self._owner.pop(seq_id, None)
            self.expired_sequences += len(lease.seq_ids)
            expired[lease_id] = lease.seq_ids
        return expired
