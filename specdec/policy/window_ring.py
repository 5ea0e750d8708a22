"""Time-bucketed additive windows: add now, sum the recent past (a sliding window)."""

from __future__ import annotations

import math

from specdec.policy.load_stats import StatsWindow


def bucket_start(at: float, bucket_s: float) -> int:
    """The bucket a time falls in, as an integer id (seconds since the epoch / bucket_s)."""
    return int(math.floor(at / bucket_s))


class WindowRing:
    """StatsWindows keyed by time bucket; `recent` sums those within the last `window_s`."""

    def __init__(self, window_s: float, bucket_s: float) -> None:
        if not 0 < bucket_s <= window_s:
            raise ValueError(f"need 0 < bucket_s ({bucket_s}) <= window_s ({window_s})")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._buckets: dict[int, StatsWindow] = {}

    @property
    def num_buckets(self) -> int:
        return max(1, round(self.window_s / self.bucket_s))

    def add(self, delta: StatsWindow | dict[str, float], at: float) -> None:
        self._buckets.setdefault(bucket_start(at, self.bucket_s), StatsWindow()).merge(delta)
        self._expire(at)

    def recent(self, now: float) -> StatsWindow:
        self._expire(now)
        total = StatsWindow()
        for window in self._buckets.values():
            total.merge(window)
        return total

    def _expire(self, now: float) -> None:
        oldest = bucket_start(now, self.bucket_s) - self.num_buckets + 1
        for key in [k for k in self._buckets if k < oldest]:
            del self._buckets[key]
