"""The emulated 8B/1B H100 pair for serving tests: a started app, and the emulated target decoding alone."""

from __future__ import annotations

from collections.abc import Callable

from actors.app import free_port, start_app
from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_engine
from specdec.requests.request import GenerationRequest

PROFILE = "h100-llama-8b-1b"
MODELS = {"target": f"emulated:{PROFILE}:target", "draft": f"emulated:{PROFILE}:draft", "device_time_scale": 0.05}
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n"]


def started(tensor_parallel_size: int):
    """The app serving the emulated pair (drafting ahead on), device times x0.05."""
    config = load_config(overrides={
        "models": MODELS, "cache": {"num_slots": 8, "max_seq_len": 256}, "speculation": {"overlap": True},
        "serving": {"port": free_port(), "http_port": free_port(), "tensor_parallel_size": tensor_parallel_size,
                    "distributed_backend": "gloo"},
    })
    return start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})


def target_alone() -> Callable[[str, int], list[int]]:
    """(text, max_new_tokens) -> the emulated target's greedy tokens, decoded alone in-process."""
    built = build_engine(load_config(overrides={
        "models": {**MODELS, "device_time_scale": 0.0}, "speculation": {"proposer": "none", "gamma": 0},
        "load_monitor": {"enabled": False}}))
    return lambda text, n: built.engine.generate([GenerationRequest(built.encode(text), n)])[0].token_ids
