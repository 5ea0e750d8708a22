"""EmulatedDevice: an accelerator that is busy for a given time while its host thread waits.

A host thread that launched GPU kernels waits for them without computing; here the thread
that runs a forward holds the device (one forward at a time, like one CUDA stream) and
sleeps until the forward's device time has passed since it began. The work done on the
host meanwhile (the emulated model's logits) counts inside that time, as a GPU overlaps
with the host's launches. Sleeping releases the GIL, so other threads and processes run
while the device is busy: device time costs no CPU time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class EmulatedDevice:
    """One device: `run` executes a forward and keeps the device busy for its time."""

    def __init__(self, name: str, time_scale: float = 1.0) -> None:
        if time_scale < 0:
            raise ValueError(f"time_scale={time_scale} must be >= 0")
        self.name = name
        self.time_scale = time_scale
        self._lock = threading.Lock()  # one forward at a time
        self.busy_s = 0.0  # device time spent so far (scaled), seconds
        self.late_s = 0.0  # how much later than their device time forwards returned (host wake-up delays)
        self.forwards = 0

    def run(self, seconds: float, work: Callable[[], T]) -> T:
        """Wait for the device, run `work` on the host, and return its result once
        `seconds` * time_scale have passed since the forward began (sleeping, not spinning)."""
        duration = max(0.0, seconds) * self.time_scale
        with self._lock:
            start = time.perf_counter()
            result = work()
            remaining = start + duration - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)
            self.late_s += max(0.0, time.perf_counter() - start - duration)
            self.busy_s += duration
            self.forwards += 1
        return result
