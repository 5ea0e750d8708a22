"""served_threads' counters: each thread's CPU, run-queue wait and wake-ups from the kernel's
scheduler files, and their difference per round, per process and per thread."""

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import served_threads as st


def test_a_busy_thread_shows_its_cpu_and_a_sleeping_one_its_wake_ups():
    worked, read = threading.Barrier(3), threading.Event()

    def spin():
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        worked.wait()
        read.wait()

    def nap():
        for _ in range(5):
            time.sleep(0.002)
        worked.wait()
        read.wait()

    before = st.thread_counters(os.getpid())
    threads = [threading.Thread(target=spin, name="spin"), threading.Thread(target=nap, name="nap")]
    for t in threads:
        t.start()
    worked.wait()
    ids = {t.name: t.native_id for t in threads}
    counters = {name: st.thread_counters(os.getpid())[tid] for name, tid in ids.items()}
    read.set()
    for t in threads:
        t.join()
    assert counters["spin"][1] >= 0.04 and counters["nap"][3] >= 4
    assert all(tid not in before for tid in ids.values())


def test_the_difference_is_per_round_per_process_and_per_thread():
    before = {1: {10: ("loop", 1.0, 0.5, 100, 3), 11: ("io", 0.1, 0.0, 10, 0)}}
    after = {1: {10: ("loop", 1.2, 0.7, 140, 5), 11: ("io", 0.1, 0.0, 20, 0), 12: ("new", 0.02, 0.0, 4, 0)}}
    rows = st.difference(before, after, {1: "ray::Router"}, rounds=10, top=2, names={1: {10: "engine: _run"}})
    (row,) = rows
    assert round(row["cpu_ms"], 6) == 22.0 and round(row["wait_ms"], 6) == 20.0
    assert row["wakeups"] == 5.4 and row["preempted"] == 0.2
    assert [t["label"] for t in row["busiest"]] == ["engine: _run", "new"]
