"""OutputHandoff: a round's items reach their streams in order, each once, with one wake-up
per event loop; a closed loop's streams are reported lost; a cancelled stream's items stop."""

import asyncio

import pytest

from specdec.serving.async_engine import RequestStream
from specdec.serving.output_handoff import OutputHandoff


class Receiver:
    def __init__(self, loop) -> None:
        self.loop = loop
        self.items: list = []

    def receive(self, item) -> None:
        self.items.append(item)


class CountingLoop:
    """Stands for an event loop: runs what is scheduled at once, counts the wake-ups."""

    def __init__(self, closed: bool = False) -> None:
        self.calls = 0
        self.closed = closed

    def call_soon_threadsafe(self, callback, *args) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls += 1
        callback(*args)


@pytest.fixture
def own_stream():
    """A RequestStream on its own event loop, its owner recording the abort it sends."""
    class Owner:
        def __init__(self) -> None:
            self.sent = []

        def _send(self, command) -> None:
            self.sent.append(command.kind)

    loop = asyncio.new_event_loop()
    owner = Owner()
    stream = RequestStream(owner, "req-0", loop)
    yield stream, loop
    assert owner.sent == ["abort"]
    loop.close()


def test_items_arrive_in_order_once_each_with_one_wake_up_per_loop_and_flush():
    first_loop, second_loop = CountingLoop(), CountingLoop()
    a, b, c = Receiver(first_loop), Receiver(first_loop), Receiver(second_loop)
    handoff = OutputHandoff(on_lost=lambda r: None)
    for item in range(3):
        for receiver in (a, b, c):
            handoff.keep(receiver, (id(receiver), item))
    assert len(handoff) == 9 and a.items == []  # nothing is handed over before the flush
    handoff.flush()
    assert [a.items, b.items, c.items] == [[(id(r), i) for i in range(3)] for r in (a, b, c)]
    assert (first_loop.calls, second_loop.calls) == (1, 1)
    handoff.flush()  # nothing kept: no wake-up, nothing handed twice
    assert (first_loop.calls, second_loop.calls, len(a.items)) == (1, 1, 3)


def test_a_closed_loop_reports_each_of_its_streams_once_and_spares_the_others():
    closed, open_loop = CountingLoop(closed=True), CountingLoop()
    gone, alive = Receiver(closed), Receiver(open_loop)
    lost = []
    handoff = OutputHandoff(on_lost=lost.append)
    for item in range(2):
        handoff.keep(gone, item)
        handoff.keep(alive, item)
    handoff.flush()
    assert lost == [gone] and alive.items == [0, 1]


def test_a_cancelled_streams_items_stop(own_stream):
    stream, loop = own_stream
    handoff = OutputHandoff(on_lost=lambda r: None)

    async def main():
        handoff.keep(stream, "round 1")
        handoff.flush()
        await asyncio.sleep(0)
        assert stream._queue.qsize() == 1
        await stream.aclose()  # the consumer stops: what still arrives is dropped
        handoff.keep(stream, "round 2")
        handoff.flush()
        await asyncio.sleep(0)
        assert stream._queue.qsize() == 1

    loop.run_until_complete(main())
