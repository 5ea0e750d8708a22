"""A progress line per benchmark step on stderr: how far, how long so far, about how long left."""

from __future__ import annotations

import sys
import time


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    """`with Progress(n, "sweep") as p: ... p.step("qps 4 auto")` prints, before each step,
    `[sweep 3/12 ##########---------- 25%] 1m20s, ~4m00s left: qps 4 auto` (the estimate
    assumes the remaining steps take as long as the finished ones), and a last line at the end."""

    WIDTH = 20

    def __init__(self, total: int, label: str, stream=None) -> None:
        self.total, self.label = max(1, total), label
        self.done = 0  # steps finished
        self.announced = 0  # steps started
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.done = self.total
            self._print("done")

    def step(self, what: str) -> None:
        """Announce the next step (the previous one is counted as finished)."""
        self.done = self.announced
        self.announced += 1
        self._print(what)

    def _print(self, what: str) -> None:
        elapsed = time.perf_counter() - self.start
        filled = self.WIDTH * self.done // self.total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        left = f", ~{_clock(elapsed / self.done * (self.total - self.done))} left" if 0 < self.done < self.total else ""
        print(f"[{self.label} {min(self.announced, self.total)}/{self.total} {bar} {100 * self.done // self.total}%] "
              f"{_clock(elapsed)}{left}: {what}", file=self.stream, flush=True)
