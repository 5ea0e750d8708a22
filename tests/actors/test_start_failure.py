"""A start that cannot succeed fails within seconds naming the router replica's own exception
(actors/start_failure.py), not Serve's summary "Deploying application specdec failed", whether
the router's backend fails at once (Serve gives up on the replica) or after the replica was
already running (the readiness wait asks the router)."""

from __future__ import annotations

import functools
import time

import pytest
import ray

from actors.app import free_port, start_app
from actors.start_failure import StartFailed, last_line
from specdec.config.config import load_config

pytestmark = pytest.mark.slow
REASON = "need 0 <= enable_in_flight (1e9) < disable_in_flight (1e9)"


def failing_start(delay_s: float) -> tuple[BaseException, float]:
    def backend(delay: float):  # a local function: Ray pickles it by value into the replica
        time.sleep(delay)
        raise ValueError(REASON)

    config = load_config(overrides={"serving": {"port": free_port(), "http_port": free_port()},
                                    "load_monitor": {"enabled": False}})
    started = time.monotonic()
    with pytest.raises(StartFailed) as failed:
        start_app(config, backend_factory=functools.partial(backend, delay_s), ready_timeout_s=120,
                  ray_init_kwargs={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
    return failed.value, time.monotonic() - started


@pytest.mark.parametrize("delay_s", [0.0, 3.0], ids=["at-once", "after-the-replica-runs"])
def test_a_failing_router_backend_fails_the_start_naming_its_exception(delay_s):
    failure, took_s = failing_start(delay_s)
    assert str(failure).endswith(f"ValueError: {REASON}") and "\n" not in str(failure)
    assert took_s < 60, f"took {took_s:.0f}s (the readiness wait is 120s)"
    assert not ray.is_initialized(), "what the start started is shut down"


def test_the_last_line_of_a_remote_traceback_is_its_exception():
    message = "The deployment failed.\nError:\n\x1b[36mray::Replica\x1b[39m\n  File \"x.py\"\nValueError: bad\n\n"
    assert last_line(message) == "ValueError: bad"
