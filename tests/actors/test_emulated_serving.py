"""The whole serving stack on emulated devices (TP 1, and TP 2 once): Ray workers, the router behind Serve's
gRPC proxy, drafting ahead while the target verifies; only the devices are emulated.
Greedy output through the server equals the emulated target decoding alone, in-process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from actors.app import free_port, start_app
from specdec.config import load_config
from specdec.engine_builder import build_engine
from specdec.request import GenerationRequest
from specdec_rpc.client import SpecdecClient

pytestmark = pytest.mark.slow

PROFILE = "h100-llama-8b-1b"
MODELS = {"target": f"emulated:{PROFILE}:target", "draft": f"emulated:{PROFILE}:draft", "device_time_scale": 0.05}
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n"]


def started(tensor_parallel_size: int):
    config = load_config(overrides={
        "models": MODELS, "cache": {"num_slots": 8, "max_seq_len": 256}, "speculation": {"overlap": True},
        "serving": {"port": free_port(), "http_port": free_port(), "tensor_parallel_size": tensor_parallel_size,
                    "distributed_backend": "gloo"},
    })
    return start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})


@pytest.fixture(scope="module")
def app():
    app = started(1)
    yield app
    app.shutdown()


@pytest.fixture(scope="module")
def target_alone():
    built = build_engine(load_config(overrides={
        "models": {**MODELS, "device_time_scale": 0.0}, "speculation": {"proposer": "none", "gamma": 0},
        "load_monitor": {"enabled": False}}))
    return lambda text, n: built.engine.generate([GenerationRequest(built.encode(text), n)])[0].token_ids


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


def test_a_tensor_parallel_emulated_target_serves_the_same_output(target_alone):
    app = started(2)  # each rank an emulated device; the leader waits for its follower
    try:
        with SpecdecClient(app.address) as client:
            response = client.generate(PROMPTS[1], max_new_tokens=30, mode="on")
        assert list(response.token_ids) == target_alone(PROMPTS[1], 30)
    finally:
        app.shutdown()
