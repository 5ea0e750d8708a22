"""The load monitor in the real server with a real Redis: the operator's QPS override switches
speculation off under high QPS and on again when the load drops, every replica sees the same
decision, greedy output never changes, and a Redis outage neither stops serving nor fails a
request."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.app import free_port, start_app
from redis_server import RedisServer
from specdec.config.config import load_config
from specdec_rpc.public.client import AsyncSpecdecClient, SpecdecClient

MAX_NEW = 40


@pytest.fixture(scope="module")
def redis():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app(redis):
    config = load_config(overrides={
        "cache": {"num_slots": 16, "max_seq_len": 256},
        "serving": {"port": free_port(), "http_port": free_port(), "router_replicas": 2, "max_concurrent_requests": 48},
        "load_monitor": {
            "redis_url": redis.url, "deployment": "switch-test", "window_s": 3.0, "bucket_s": 0.5,
            "disable_qps": 4.0, "enable_qps": 1.0, "disable_in_flight": 1000, "enable_in_flight": 500,
            "min_dwell_s": 0.5, "stale_after_s": 2.0,
            "explore_interval_s": 0,  # no exploration rounds: while off, nothing is drafted at all
        },
    })
    app = start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
    yield app
    app.shutdown()


def replica_views(client: SpecdecClient, samples: int = 8) -> list:
    """GetStats answered by whichever replica the proxy picks; several samples cover both."""
    return [client.stats() for _ in range(samples)]


def wait_for(client: SpecdecClient, predicate, timeout_s: float = 20.0):
    deadline = time.time() + timeout_s
    views = []
    while time.time() < deadline:
        views = replica_views(client)
        if all(predicate(v) for v in views):
            return views
        time.sleep(0.25)
    raise AssertionError(
        f"condition not reached; last views: {[(v.speculation_enabled, v.qps, v.reason) for v in views]}"
    )


async def burst(address: str, prompts: list[list[int]], count: int) -> list:
    async with AsyncSpecdecClient(address, timeout_s=120.0) as client:
        return await asyncio.gather(*(
            client.generate(prompt_token_ids=prompts[i % len(prompts)], max_new_tokens=4) for i in range(count)
        ))


def test_high_qps_switches_speculation_off_and_low_qps_back_on(app, prompt_ids, hf_greedy):
    with SpecdecClient(app.address, timeout_s=60.0) as client:
        views = wait_for(client, lambda v: v.speculation_enabled and v.measurements_source == "shared")
        assert len({v.speculation_enabled for v in views}) == 1
        # a long greedy request lives through the switch off and on again
        with SpecdecClient(app.address, timeout_s=120.0) as long_client:
            stream = long_client.generate_stream(prompt_token_ids=prompt_ids[0], max_new_tokens=MAX_NEW)
            first = next(stream)
            responses = asyncio.run(burst(app.address, prompt_ids, 40))
            off = wait_for(client, lambda v: not v.speculation_enabled and v.gamma == 0)
            assert all("load high" in v.reason for v in off)  # both replicas: one shared decision
            on = wait_for(client, lambda v: v.speculation_enabled, timeout_s=30.0)
            assert all(v.qps < 1.0 for v in on)
            rest = list(stream)
        tokens = [*first.token_ids, *(t for chunk in rest for t in chunk.token_ids)]
        assert tokens == hf_greedy(prompt_ids[0], MAX_NEW)
        for i, response in enumerate(responses[:8]):
            assert list(response.token_ids) == hf_greedy(prompt_ids[i % len(prompt_ids)], 4)


def test_requests_while_off_make_no_draft_calls(app, prompt_ids):
    with SpecdecClient(app.address, timeout_s=60.0) as client:
        asyncio.run(burst(app.address, prompt_ids, 40))
        wait_for(client, lambda v: not v.speculation_enabled)
        response = client.generate(prompt_token_ids=prompt_ids[1], max_new_tokens=8)
        assert response.stats.drafted == 0 and not response.stats.speculation_enabled
        forced = client.generate(prompt_token_ids=prompt_ids[1], max_new_tokens=8, mode="on")
        assert forced.stats.drafted > 0  # a per-request override still speculates
        assert list(forced.token_ids) == list(response.token_ids)


def test_redis_outage_never_stops_serving_and_the_monitor_reconnects(app, redis, prompt_ids, hf_greedy):
    with SpecdecClient(app.address, timeout_s=60.0) as client:
        wait_for(client, lambda v: v.measurements_source == "shared")
        redis.stop()
        results = [client.generate(prompt_token_ids=prompt_ids[i % 4], max_new_tokens=12) for i in range(6)]
        assert [list(r.token_ids) for r in results] == [hf_greedy(prompt_ids[i % 4], 12) for i in range(6)]
        wait_for(client, lambda v: v.measurements_source == "local")
        redis.start()
        wait_for(client, lambda v: v.measurements_source == "shared" and v.circuit_breaker == "closed")
        assert list(client.generate(prompt_token_ids=prompt_ids[0], max_new_tokens=12).token_ids) == hf_greedy(
            prompt_ids[0], 12)
