"""EmulatedDevice: an accelerator that is busy for a given time while its host thread waits.

A host thread that launched GPU kernels waits for them without computing; here the thread
that runs a forward holds the device (one forward at a time, like one CUDA stream) and
sleeps until the forward's device time has passed since it began. The work done on the
host meanwhile (the emulated model's logits) counts inside that time, as a GPU overlaps
with the host's launches. Sleeping releases the GIL, so other threads and processes run
while the device is busy: device time costs no CPU time.

The wait is precise, as a host thread's wake-up after a GPU kernel is (a few microseconds
when CUDA spin-waits): the thread sleeps until `SPIN_S` before the end, with the kernel's
timer slack at its minimum for that thread (Linux adds 50 µs to every sleep by default), and
spins the rest. A plain sleep returns late by the timer slack and the scheduler's wake-up,
which every forward of a round would add to the framework cost although no real device
causes it (measured: docs/emulated_devices.md).

Every device of a process is listed by `process_devices()`, so that a benchmark can read how
long the devices of a worker process were busy (the emulated device time of a round) without
anything on the round path knowing that its model is emulated.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_DEVICES: weakref.WeakSet = weakref.WeakSet()  # every live EmulatedDevice of this process
SPIN_S = 1e-4  # the end of a forward's wait is spun, not slept (see the module's docstring)
_PR_SET_TIMERSLACK = 29  # prctl option (linux/prctl.h): this thread's timer slack in ns
_precise_threads = threading.local()  # .done: this thread's timer slack is already minimal


def _precise_sleeps() -> None:
    """Make this thread's sleeps end when asked (1 ns timer slack); once per thread, Linux only."""
    if getattr(_precise_threads, "done", False):
        return
    _precise_threads.done = True
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: sleeps are only less precise
            pass


def wait_until(end: float) -> None:
    """Return at time.perf_counter() == end: sleep until SPIN_S before it, spin the rest."""
    _precise_sleeps()
    remaining = end - time.perf_counter() - SPIN_S
    if remaining > 0:
        time.sleep(remaining)
    while time.perf_counter() < end:
        pass


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

    def run(self, seconds: float | Callable[[], float], work: Callable[[], T]) -> T:
        """Wait for the device, run `work` on the host, and return its result once
        `seconds` * time_scale have passed since the forward began (sleeping, but for the
        last SPIN_S). `seconds` may be a function, called once the forward began (so that
        working out its time is host work within the device time too)."""
        with self._lock:
            start = time.perf_counter()
            duration = max(0.0, seconds() if callable(seconds) else seconds) * self.time_scale
            result = work()
            wait_until(start + duration)
            self.late_s += max(0.0, time.perf_counter() - start - duration)
            self.busy_s += duration
            self.forwards += 1
        return result
