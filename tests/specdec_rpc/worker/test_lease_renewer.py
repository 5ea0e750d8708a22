"""LeaseRenewer on an injected clock: a keep-alive only after a third of the TTL without calls."""

from __future__ import annotations

import threading

import pytest

from specdec_rpc.worker.lease_renewer import LeaseRenewer, new_lease_id


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Worker:
    """Answers KeepAlive with its TTL, or fails while `down`."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s, self.down, self.renewed = ttl_s, False, []

    def keep_alive(self, lease_id: str) -> float:
        if self.down:
            raise ConnectionError("worker unreachable")
        self.renewed.append(lease_id)
        return self.ttl_s


def test_calls_make_keep_alives_unnecessary_and_silence_makes_them_due():
    clock, worker = Clock(), Worker(6.0)
    renewer = LeaseRenewer("lease-a", worker.keep_alive, ttl_s=6.0, clock=clock)
    for _ in range(5):
        clock.now += 1.9
        renewer.touch()  # a Propose / Verify / Release was sent
        assert not renewer.renew_if_due()
    clock.now += 2.0  # a third of the TTL without a call
    assert renewer.renew_if_due() and worker.renewed == ["lease-a"]
    assert not renewer.renew_if_due()  # the keep-alive itself renewed it
    clock.now += 2.0
    assert renewer.renew_if_due() and renewer.keep_alives == 2


def test_the_period_follows_the_ttl_the_worker_states():
    clock, worker = Clock(), Worker(0.9)
    renewer = LeaseRenewer("lease-a", worker.keep_alive, ttl_s=6.0, clock=clock)
    clock.now += 2.0
    assert renewer.renew_if_due() and renewer.ttl_s == 0.9 and renewer.period_s == pytest.approx(0.3)
    clock.now += 0.31
    assert renewer.renew_if_due()


def test_a_failed_keep_alive_is_retried_on_the_next_tick(caplog):
    clock, worker = Clock(), Worker(3.0)
    renewer = LeaseRenewer("lease-a", worker.keep_alive, ttl_s=3.0, clock=clock)
    worker.down = True
    clock.now += 1.0
    assert not renewer.renew_if_due() and not renewer.renew_if_due()
    assert len([r for r in caplog.records if "keep-alive failed" in r.message]) == 1  # logged once
    worker.down = False
    assert renewer.renew_if_due() and worker.renewed == ["lease-a"]


def test_the_thread_renews_until_closed():
    renewed = threading.Event()
    renewer = LeaseRenewer("lease-a", lambda lease_id: renewed.set() or 0.06, ttl_s=0.06).start()
    try:
        assert renewed.wait(5.0)
    finally:
        renewer.close()
    count = renewer.keep_alives
    renewed.clear()
    assert not renewed.wait(0.2) and renewer.keep_alives == count


def test_lease_ids_are_unique():
    assert len({new_lease_id() for _ in range(100)}) == 100
