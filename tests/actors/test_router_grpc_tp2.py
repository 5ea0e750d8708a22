"""The public gRPC API on a tensor-parallel target (2 gloo ranks in one placement group):
greedy output still equals transformers' generate of the target alone."""

from __future__ import annotations

import pytest
import ray

from actors.app import free_port, start_app
from specdec.config.config import load_config
from specdec_rpc.public.client import SpecdecClient


@pytest.fixture(scope="module")
def app():
    config = load_config(
        overrides={
            "cache": {"num_slots": 4, "max_seq_len": 256},
            "serving": {"port": free_port(), "http_port": free_port(), "tensor_parallel_size": 2,
                        "distributed_backend": "gloo"},
            "speculation": {"overlap": True},  # pipelined rounds on the tensor-parallel target
        }
    )
    app = start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
    yield app
    app.shutdown()


@pytest.mark.parametrize("proposer, mode", [("draft", "on"), ("ngram", "on"), (None, "off")])
def test_greedy_output_through_a_tensor_parallel_target_equals_transformers(app, prompt_ids, hf_greedy, proposer, mode):
    with SpecdecClient(app.address) as client:
        assert client.health() == "SERVING"
        response = client.generate(prompt_token_ids=prompt_ids[2], max_new_tokens=20, proposer=proposer, mode=mode)
    assert list(response.token_ids) == hf_greedy(prompt_ids[2], 20)
    assert ray.get(app.hub.target_info.remote())["tensor_parallel_size"] == 2
