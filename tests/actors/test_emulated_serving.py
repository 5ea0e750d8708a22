"""The whole serving stack on emulated devices, at TP 1 and TP 2 (each rank an emulated device;
the leader waits for its follower): Ray workers, the router behind Serve's gRPC proxy, drafting
ahead while the target verifies; only the devices are emulated.
Greedy output through the server equals the emulated target decoding alone, in-process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from emulated_pair import PROMPTS, started
from emulated_pair import target_alone as decode_alone

from specdec_rpc.public.client import SpecdecClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def app(request):
    app = started(request.param)
    yield app
    app.shutdown()


@pytest.fixture(scope="module")
def target_alone():
    return decode_alone()


@pytest.mark.parametrize("mode", ["on", "off"])
def test_served_greedy_output_equals_the_emulated_target_alone(app, target_alone, mode):
    with SpecdecClient(app.address) as client:
        assert client.health() == "SERVING"
        response = client.generate(PROMPTS[0], max_new_tokens=40, mode=mode)
    assert list(response.token_ids) == target_alone(PROMPTS[0], 40)
    if mode == "on":
        assert response.stats.accepted > 0


def test_concurrent_streams_each_equal_their_output_alone(app, target_alone):
    def one(text: str) -> list[int]:
        with SpecdecClient(app.address) as client:
            return list(client.generate(text, max_new_tokens=30, mode="on").token_ids)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = list(pool.map(one, PROMPTS))
    assert served == [target_alone(text, 30) for text in PROMPTS]



def test_the_workers_devices_report_the_device_time_the_requests_used(app):
    import ray

    before = ray.get(app.hub.emulated_devices.remote())
    with SpecdecClient(app.address) as client:
        client.generate(PROMPTS[1], max_new_tokens=20, mode="on")
    after = ray.get(app.hub.emulated_devices.remote())
    for role in ("draft", "target"):
        [was], [now] = before[role], after[role]
        assert now["name"].endswith(f":{role}")
        assert now["forwards"] > was["forwards"] and now["busy_s"] > was["busy_s"]
