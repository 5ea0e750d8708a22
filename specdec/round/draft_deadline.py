"""DraftDeadline: how long a round waits for its drafts.

Speculation may change speed, never output, so the target never waits on a draft beyond a
small budget. A round that asks a remote proposer for drafts waits at most `budget_s()`:
`multiple` x the p99 of the recent calls that answered, at least `floor_s` (scheduling noise
of a busy host is no miss), at most `cap_s` (far below the worker's own call limit; also the
budget until a call was measured). A round whose drafts miss it verifies without them
(target-only rows: lossless), and its late reply is never used.

A call that answered late still says what a call costs now: `answered_late` keeps its
duration when it is within `cap_s`, so a draft that became slower (larger batches, longer
histories) raises its own budget instead of missing forever; a reply later than that (the
worker was stopped) says nothing about drafting and is not kept. Misses in a row say the
proposer keeps missing: `missed()` answers True from the `misses_to_open`-th on, and the
caller then treats the proposer as down (circuit open) until it answers again.

Pure: no clock of its own, no I/O; the caller times its calls.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

FLOOR_S = 0.2  # the least a round waits for drafts, seconds
MULTIPLE = 3.0  # the budget is this many times the p99 of recent calls
CAP_S = 1.0  # the most a round waits for drafts, seconds
WINDOW = 256  # recent calls the p99 is taken over
MISSES_TO_OPEN = 3  # misses in a row after which the proposer is treated as down


class DraftDeadline:
    """A round's budget for its drafts, from the measured times of recent draft calls."""

    def __init__(self, floor_s: float = FLOOR_S, multiple: float = MULTIPLE, cap_s: float = CAP_S,
                 window: int = WINDOW, misses_to_open: int = MISSES_TO_OPEN) -> None:
        if not 0 < floor_s <= cap_s or multiple < 1 or window < 1 or misses_to_open < 1:
            raise ValueError(f"need 0 < floor_s ({floor_s}) <= cap_s ({cap_s}), multiple >= 1 ({multiple}), "
                             f"window >= 1 ({window}), misses_to_open >= 1 ({misses_to_open})")
        self.floor_s, self.multiple, self.cap_s = floor_s, multiple, cap_s
        self.misses_to_open = misses_to_open
        self._seconds: deque[float] = deque(maxlen=window)  # the window, oldest first
        self._sorted: list[float] = []  # the same samples, in order: the p99 is an index
        self.misses = 0  # misses since the last call that answered in time
        self.missed_calls = 0  # every miss so far

    @classmethod
    def within(cls, limit_s: float) -> "DraftDeadline":
        """The default deadline for calls that may run at most limit_s (floor and cap no higher)."""
        cap_s = min(CAP_S, limit_s)
        return cls(floor_s=min(FLOOR_S, cap_s), cap_s=cap_s)

    def p99_s(self) -> float | None:
        """The p99 of the recent calls' seconds (None before the first)."""
        ordered = self._sorted
        if not ordered:
            return None
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

    def budget_s(self) -> float:
        """How long the next call may take before its round goes on without it."""
        p99 = self.p99_s()
        if p99 is None:
            return self.cap_s
        return min(self.cap_s, max(self.floor_s, self.multiple * p99))

    def answered(self, seconds: float) -> None:
        """A call answered within its budget after `seconds`: a sample, and the misses in a row end."""
        self._add(seconds)
        self.misses = 0

    def answered_late(self, seconds: float) -> None:
        """A call that missed its budget answered after all, `seconds` after it was sent."""
        if seconds <= self.cap_s:
            self._add(seconds)

    def missed(self) -> bool:
        """A call missed its budget; True when the proposer keeps missing (treat it as down)."""
        self.misses += 1
        self.missed_calls += 1
        return self.misses >= self.misses_to_open

    def found_again(self) -> None:
        """The proposer answered a probe in time after it was taken for down: a fresh start."""
        self.misses = 0

    def describe(self) -> str:
        """The budget and where it comes from, for status reasons and logs."""
        p99 = self.p99_s()
        source = "not measured yet" if p99 is None else f"{self.multiple:g} x p99 {1000 * p99:.0f} ms"
        return f"{1000 * self.budget_s():.0f} ms ({source}; floor {1000 * self.floor_s:.0f} ms, " \
               f"cap {1000 * self.cap_s:.0f} ms)"

    def _add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if len(self._seconds) == self._seconds.maxlen:  # the window is full: its oldest sample goes
            del self._sorted[bisect.bisect_left(self._sorted, self._seconds[0])]
        self._seconds.append(seconds)
        bisect.insort(self._sorted, seconds)
