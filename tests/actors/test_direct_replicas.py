"""Two router replicas, each serving on its own ports (serving.ingress direct), reached by one
client through the list of their addresses.

Discovery lists both; the client's calls go round-robin to both (each replica's own round
count, read on its own port, says which served) with the reference's greedy tokens; when one
replica is killed, the streams it served end as UNAVAILABLE, the other's finish unharmed, and
the next calls go to the other. The models run in the routers (the bundled pair).
"""

from __future__ import annotations

import functools
import os
import signal
import threading

import grpc
import pytest

from actors.app import free_port, start_app
from ray_processes import actor_pids, listening_sockets
from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_served_engine
from specdec_rpc.public.client import SpecdecClient

MAX_NEW = 200  # a stream still running when its replica is killed


@pytest.fixture(scope="module")
def app():
    config = load_config(overrides={
        "cache": {"num_slots": 4, "max_seq_len": 256},
        "serving": {"port": free_port(), "http_port": free_port(), "host": "127.0.0.1", "ingress": "direct",
                    "router_replicas": 2, "direct_port": free_port(), "direct_http_port": free_port()},
    })
    app = start_app(config, backend_factory=functools.partial(build_served_engine, config),
                    ray_init_kwargs={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
    yield app
    app.shutdown()


def rounds(address: str) -> int:
    """The rounds the replica at `address` ran (GetStats answered on its own port)."""
    with SpecdecClient(address, timeout_s=30.0, retries=0) as client:
        return client.stats().rounds


def stream_tokens(client: SpecdecClient, prompt: list[int], max_new: int) -> list[int]:
    return [t for chunk in client.generate_stream(prompt_token_ids=prompt, max_new_tokens=max_new)
            for t in chunk.token_ids]


def test_round_robin_calls_reach_both_replicas_with_the_reference_tokens(app, prompt_ids, hf_greedy):
    assert len(set(app.direct_addresses)) == 2 and app.address not in app.direct_addresses
    before = {a: rounds(a) for a in app.direct_addresses}
    with SpecdecClient(",".join(app.direct_addresses), timeout_s=60.0, retries=0) as client:
        for prompt in prompt_ids[:4] * 2:
            assert stream_tokens(client, prompt, 8) == hf_greedy(prompt, 8)
    assert all(rounds(a) > before[a] for a in app.direct_addresses), (before, app.direct_addresses)


def replica_pid(address: str) -> int:
    """The router replica's process listening on address's port."""
    port = int(address.rsplit(":", 1)[1])
    [pid] = [pid for pid in actor_pids(":SpecdecRouter") if any(p == port for _, p in listening_sockets([pid]))]
    return pid


def test_a_killed_replicas_streams_end_unavailable_and_the_next_calls_go_to_the_other(app, tokenizer, hf_greedy):
    """(Last in this module: Serve replaces the killed replica afterwards.)"""
    doomed, survivor = app.direct_addresses
    prompt = tokenizer("class Stack:", add_special_tokens=False)["input_ids"]
    reference = hf_greedy(prompt, MAX_NEW)
    outcomes: dict[str, list] = {}
    with SpecdecClient(",".join(app.direct_addresses), timeout_s=120.0, retries=0) as spread, \
            SpecdecClient(doomed, timeout_s=120.0, retries=0) as on_doomed, \
            SpecdecClient(survivor, timeout_s=120.0, retries=0) as on_survivor:
        for _ in range(4):  # the list's channel connects to both before the streams start, so they alternate
            assert spread.health() == "SERVING"
        streams = {"doomed": on_doomed.generate_stream(prompt_token_ids=prompt, max_new_tokens=MAX_NEW),
                   "survivor": on_survivor.generate_stream(prompt_token_ids=prompt, max_new_tokens=MAX_NEW),
                   **{f"spread {i}": spread.generate_stream(prompt_token_ids=prompt, max_new_tokens=MAX_NEW)
                      for i in range(4)}}
        firsts = {name: list(next(stream).token_ids) for name, stream in streams.items()}

        def finish(name):
            try:
                outcomes[name] = firsts[name] + [t for chunk in streams[name] for t in chunk.token_ids]
            except grpc.RpcError as exc:
                outcomes[name] = exc.code().name

        threads = [threading.Thread(target=finish, args=(name,)) for name in streams]
        for thread in threads:
            thread.start()
        os.kill(replica_pid(doomed), signal.SIGKILL)
        for thread in threads:
            thread.join(timeout=120)
        before = rounds(survivor)
        for _ in range(3):  # the next calls: the other replica serves them, none fails
            assert stream_tokens(spread, prompt, 8) == reference[:8]
        assert rounds(survivor) > before
    assert outcomes["doomed"] == "UNAVAILABLE" and outcomes["survivor"] == reference
    spread_outcomes = sorted(str(outcomes[f"spread {i}"]) for i in range(4))
    assert spread_outcomes == sorted([str(reference)] * 2 + ["UNAVAILABLE"] * 2), outcomes
