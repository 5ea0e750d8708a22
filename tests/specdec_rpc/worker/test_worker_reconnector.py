"""WorkerReconnector: searches in the background, with backoff, until an address answers."""

from __future__ import annotations

import threading
import time

from specdec_rpc.worker.worker_reconnector import WorkerReconnector


def wait_for(event: threading.Event, timeout_s: float = 5.0) -> bool:
    return event.wait(timeout_s)


def test_it_resolves_again_until_a_worker_answers_then_reports_that_address_once():
    answers = iter([None, "10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3"])
    probed, found, done = [], [], threading.Event()

    def probe(address):
        probed.append(address)
        if address != "10.0.0.2:2":
            raise ConnectionError(f"nothing at {address}")

    def on_found(address):
        found.append(address)
        done.set()

    reconnector = WorkerReconnector(lambda: next(answers), probe, on_found, backoff_s=0.01, max_backoff_s=0.02)
    assert reconnector.trigger()
    assert wait_for(done)
    time.sleep(0.05)
    assert found == ["10.0.0.2:2"] and probed == ["10.0.0.1:1", "10.0.0.2:2"]
    assert reconnector.last_error is None and not reconnector.searching
    reconnector.close()


def test_one_search_at_a_time_and_none_after_close():
    reconnector = WorkerReconnector(lambda: None, lambda a: None, lambda a: None, backoff_s=0.01)
    assert reconnector.trigger() and not reconnector.trigger()  # searching already
    time.sleep(0.05)
    assert reconnector.last_error == "no worker address yet (restarting)"
    reconnector.close()
    assert not reconnector.searching and not reconnector.trigger()
    assert reconnector.searches == 1


def test_a_resolver_that_raises_is_retried_with_growing_backoff():
    calls = []

    def resolve():
        calls.append(time.monotonic())
        raise TimeoutError("hub busy")

    reconnector = WorkerReconnector(resolve, lambda a: None, lambda a: None, backoff_s=0.02, max_backoff_s=0.08)
    reconnector.trigger()
    time.sleep(0.5)
    reconnector.close()
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(calls) >= 4 and reconnector.last_error == "TimeoutError: hub busy"
    assert gaps[0] < gaps[-1] and max(gaps) < 0.3  # doubled, then capped
