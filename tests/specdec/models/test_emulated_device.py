"""An emulated device is busy for its time while its host thread waits: no CPU time, one forward at a time."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from specdec.models.emulated_device import EmulatedDevice, process_devices


def test_a_forward_takes_its_device_time_and_returns_the_work():
    device = EmulatedDevice("gpu", time_scale=1.0)
    start = time.perf_counter()
    assert device.run(0.05, lambda: "logits") == "logits"
    assert 0.05 <= time.perf_counter() - start < 0.2
    assert device.forwards == 1 and device.busy_s == pytest.approx(0.05)


def test_device_time_costs_no_cpu_time():
    device = EmulatedDevice("gpu")
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(10):
        device.run(0.02, lambda: None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.2
    assert cpu < 0.1 * wall  # waiting, not spinning


def test_host_work_runs_inside_the_device_time():
    device = EmulatedDevice("gpu")
    start = time.perf_counter()
    device.run(0.05, lambda: time.sleep(0.03))
    assert time.perf_counter() - start < 0.075  # 0.05, not 0.08


def test_one_forward_at_a_time_per_device_and_devices_run_in_parallel():
    def elapsed(devices: list[EmulatedDevice]) -> float:
        threads = [threading.Thread(target=d.run, args=(0.05, lambda: None)) for d in devices]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    one = EmulatedDevice("gpu")
    assert elapsed([one, one, one]) >= 0.15  # queued behind each other
    assert elapsed([EmulatedDevice("a"), EmulatedDevice("b"), EmulatedDevice("c")]) < 0.12


def test_time_scale_shrinks_device_time():
    device = EmulatedDevice("gpu", time_scale=0.1)
    start = time.perf_counter()
    device.run(0.2, lambda: None)
    assert time.perf_counter() - start < 0.1
    assert device.busy_s == pytest.approx(0.02)
    with pytest.raises(ValueError):
        EmulatedDevice("gpu", time_scale=-1)


def test_lateness_past_the_device_time_is_accounted():
    device = EmulatedDevice("gpu")
    device.run(0.01, lambda: time.sleep(0.03))  # host work longer than the device time
    assert device.late_s == pytest.approx(0.02, abs=0.015)
    assert device.busy_s == pytest.approx(0.01)


def test_the_process_lists_its_live_devices_with_their_busy_time():
    device = EmulatedDevice("listed-gpu", time_scale=0.01)
    device.run(0.5, lambda: None)
    [listed] = [d for d in process_devices() if d["name"] == "listed-gpu"]
    assert listed == {"name": "listed-gpu", "busy_s": pytest.approx(0.005), "late_s": listed["late_s"], "forwards": 1}
    del device
    gc.collect()
    assert not [d for d in process_devices() if d["name"] == "listed-gpu"]


def test_a_forward_ends_on_time_not_a_sleeps_timer_slack_later():
    """A host thread wakes within microseconds of its kernel's end; a plain sleep overshoots
    by ~0.1 ms, which five forwards a round would count as half a millisecond of framework."""
    device = EmulatedDevice("gpu")
    lateness = []
    for _ in range(30):
        before = device.late_s
        device.run(0.001, lambda: None)
        lateness.append(device.late_s - before)
    assert sorted(lateness)[len(lateness) // 4] < 50e-6  # a quarter of them: robust to a loaded CPU's preemptions
