"""EmulatedDevice: an accelerator that is busy for a given time while its host thread waits.

A host thread that launched GPU kernels waits for them without computing; here the thread
that runs a forward holds the device (one forward at a time, like one CUDA stream) and
sleeps until the forward's device time has passed since it began. The work done on the
host meanwhile (the emulated model's logits) counts inside that time, as a GPU overlaps
with the host's launches. Sleeping releases the GIL, so other threads and processes run
while the device is busy: device time costs no CPU time.

Every device of a process is listed by `process_devices()`, so that a benchmark can read how
long the devices of a worker process were busy (the emulated device time of a round) without
anything on the round path knowing that its model is emulated.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_DEVICES: weakref.WeakSet = weakref.WeakSet()  # every live EmulatedDevice of this process


def process_devices() -> list[dict]:
    """Each live emulated device of this process: name, busy_s, late_s, forwards (sorted by name;
    empty when nothing is emulated)."""
    return sorted(({"name": d.name, "busy_s": d.busy_s, "late_s": d.late_s, "forwards": d.forwards}
                   for d in list(_DEVICES)), key=lambda d: d["name"])


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
        _DEVICES.add(self)

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
