"""LeaseTable on an injected clock: leases lapse only when neither calls nor keep-alives renew them."""

from __future__ import annotations

import pytest

from specdec.serving.lease_table import LeaseTable

TTL = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock) -> LeaseTable:
    return LeaseTable(TTL, clock)


def test_a_lease_that_is_not_renewed_lapses_after_the_ttl_and_hands_back_its_sequences(table, clock):
    table.hold("router-a", ["a/1", "a/2"])
    clock.now += TTL
    assert table.expire() == {}  # exactly ttl_s: still alive
    clock.now += 0.01
    assert table.expire() == {"router-a": {"a/1", "a/2"}}
    assert "router-a" not in table and table.held("router-a") == set()
    assert table.expire() == {} and table.expired_sequences == 2


def test_keep_alives_and_calls_keep_a_lease_alive_indefinitely(table, clock):
    table.hold("router-a", ["a/1"])
    for _ in range(10):
        clock.now += TTL * 0.9
        table.renew("router-a")  # keep-alive
        assert table.expire() == {}
    for _ in range(10):
        clock.now += TTL * 0.9
        table.call_started("router-a")
        table.call_ended("router-a")
        assert table.expire() == {}
    assert table.held("router-a") == {"a/1"}


def test_a_lease_with_a_call_in_flight_never_lapses_and_its_clock_restarts_when_the_call_ends(table, clock):
    table.hold("router-a", ["a/1"])
    table.call_started("router-a")
    clock.now += 10 * TTL  # a very long call (or one queued behind others)
    assert table.expire() == {}
    table.call_ended("router-a")
    clock.now += TTL * 0.9
    assert table.expire() == {}
    clock.now += TTL * 0.2
    assert table.expire() == {"router-a": {"a/1"}}


def test_only_the_silent_router_loses_its_sequences(table, clock):
    table.hold("router-a", ["a/1", "a/2"])
    table.hold("router-b", ["b/1"])
    clock.now += TTL * 0.6
    table.renew("router-b")
    clock.now += TTL * 0.6
    assert table.expire() == {"router-a": {"a/1", "a/2"}}
    assert table.held("router-b") == {"b/1"} and len(table) == 1


def test_released_sequences_are_not_handed_back_again(table, clock):
    table.hold("router-a", ["a/1", "a/2", "a/3"])
    table.release(["a/2", "unknown"])
    clock.now += 2 * TTL
    assert table.expire() == {"router-a": {"a/1", "a/3"}}
    assert table.expired_sequences == 2


def test_a_sequence_held_again_under_a_new_lease_moves_to_it(table, clock):
    """A restarted router (new lease id) that reuses a wire id takes the sequence over."""
    table.hold("old", ["s/1", "s/2"])
    clock.now += TTL * 0.6
    table.hold("new", ["s/1"])
    clock.now += TTL * 0.6
    assert table.expire() == {"old": {"s/2"}}
    assert table.held("new") == {"s/1"}
    table.release(["s/1"])
    assert table.held("new") == set()


def test_a_lease_that_holds_nothing_is_forgotten_when_it_lapses(table, clock):
    table.renew("idle-router")
    clock.now += 2 * TTL
    assert table.expire() == {"idle-router": set()} and len(table) == 0
    table.renew("idle-router")  # it comes back: a fresh lease
    assert "idle-router" in table and table.expire() == {}


def test_the_ttl_must_be_positive():
    with pytest.raises(ValueError, match="ttl_s"):
        LeaseTable(0.0)
