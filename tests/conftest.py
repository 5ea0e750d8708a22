"""Shared fixtures: the bundled tiny model pair, its tokenizer and transformers' reference outputs."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from specdec.config.config import load_config
from specdec.wiring.engine_builder import BuiltEngine, build_engine
from specdec.models.model_paths import bundled_prompts, resolve_model_path

# one torch thread per pytest-xdist worker (`make test` runs the in-process tier on two), else two
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def hf_target():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model_path("bundled:target"), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("bundled:target"))


@pytest.fixture(scope="session")
def prompt_ids(tokenizer) -> list[list[int]]:
    """Held-out code prompts of different lengths (cut to 64, 47, 30 and 13 tokens, ...)."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in bundled_prompts()]
    return [p[: 64 - 17 * (i % 4)] for i, p in enumerate(ids)]


@pytest.fixture(scope="session")
def hf_greedy(hf_target, tokenizer):
    """Target-only greedy continuation from transformers' generate(), memoised."""

    @functools.lru_cache(maxsize=None)
    def run(prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
        out = hf_target.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.eos_token_id,
        )
        return out[0, len(prompt) :].tolist()

    return lambda prompt, n: run(tuple(prompt), n)


@pytest.fixture(scope="session")
def make_engine():
    """Build an in-process engine on the bundled pair with config overrides. Its γ is fixed
    (`gamma`) unless the overrides enable the load monitor (the goodput policy)."""

    def make(proposer: str = "draft", gamma: int = 4, num_slots: int = 8, **sections) -> BuiltEngine:
        overrides = {"speculation": {"proposer": proposer, "gamma": gamma}, "cache": {"num_slots": num_slots},
                     "load_monitor": {"enabled": False}}
        overrides.update(sections)
        return build_engine(load_config(overrides=overrides))

    return make


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server on a free port for the whole session."""
    from redis_server import RedisServer

    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A self-signed certificate for localhost / 127.0.0.1 and its key (PEM files)."""
    import subprocess

    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key
