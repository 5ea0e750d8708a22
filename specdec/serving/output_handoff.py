"""OutputHandoff: a round's outputs, kept on the engine's thread while it goes through them
and handed to their streams' event loops at once, in one wake-up per loop.

Each `call_soon_threadsafe` writes to its loop's wake-up pipe (a system call) and may wake
the loop again; in one Python process a woken loop takes the GIL from the engine's thread.
One per stream per round made a round with many streams wake its consumers many times;
kept and flushed, a loop is woken once per round however many of its streams got items.

Guarantees: each stream gets its items in the order they were kept, each exactly once; a
stream whose loop is closed is reported to `on_lost` (its request must be dropped); a
stream that stopped listening (cancelled) drops what still arrives (`RequestStream.receive`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class Receiver(Protocol):
    """A stream as the hand-off sees it: its event loop, `receive` called on that loop."""

    loop: asyncio.AbstractEventLoop

    def receive(self, item: Any) -> None: ...


class OutputHandoff:
    """Items kept for receivers until `flush` (called on one thread: the engine's)."""

    def __init__(self, on_lost: Callable[[Receiver], None]) -> None:
        """on_lost: called (on the flushing thread) for each receiver whose loop is closed."""
        self._on_lost = on_lost
        self._kept: list[tuple[Receiver, Any]] = []

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, receiver: Receiver, item: Any) -> None:
        """Hand `item` to `receiver` at the next flush."""
        self._kept.append((receiver, item))

    def flush(self) -> None:
        """Hand every kept item over: one `call_soon_threadsafe` per event loop."""
        hand_over(self.take(), self._on_lost)

    def take(self) -> list[tuple[Receiver, Any]]:
        """The kept items, to hand over later with `hand_over` (from any thread); none kept after."""
        kept, self._kept = self._kept, []
        return kept


def hand_over(kept: list[tuple[Receiver, Any]], on_lost: Callable[[Receiver], None]) -> None:
    """Hand `kept` over in order: one `call_soon_threadsafe` per event loop; on_lost(receiver)
    for each receiver whose loop is closed."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Receiver, Any]]] = {}
    for receiver, item in kept:
        by_loop.setdefault(receiver.loop, []).append((receiver, item))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_receive_all, items)
        except RuntimeError:  # the loop is closed: nobody listens any more
            for receiver in dict.fromkeys(receiver for receiver, _ in items):
                on_lost(receiver)


def _receive_all(items: list[tuple[Receiver, Any]]) -> None:
    """On the receivers' loop: each item to its receiver, in order."""
    for receiver, item in items:
        receiver.receive(item)
