"""SpecdecRouter.check_health (Serve's replica health check) after a drain: a drained replica
refuses every request, so it must fail the check (Serve then replaces it on a pod that keeps
running); while it loads, and while a drain is still waiting for its requests, it passes."""

from __future__ import annotations

import asyncio
import threading

import pytest

import actors.router as router_module


@pytest.fixture
def loading_router(monkeypatch):
    """A router whose backend is still loading (the load fails once the test ends)."""
    monkeypatch.setattr(router_module, "own_cores", lambda count: None)  # not this test process's cores
    monkeypatch.setattr(router_module.proxy_binding, "install", lambda: None)
    release = threading.Event()

    def factory():
        release.wait(timeout=30)
        raise RuntimeError("the test ended")

    router = router_module.SpecdecRouter.func_or_class(factory)
    yield router
    release.set()
    router._loader.join(timeout=10)


def test_a_loading_router_passes_and_a_drained_one_fails_serves_health_check(loading_router):
    loading_router.check_health()
    report = asyncio.run(loading_router.drain(grace_s=1.0))
    assert report["in_flight"] == 0
    with pytest.raises(RuntimeError, match="drained"):
        loading_router.check_health()
