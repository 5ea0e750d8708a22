"""Leases over real gRPC on 127.0.0.1 (a draft and a target worker with the bundled models, no Ray).

A "router" is what the Serve replica runs: a RemoteVerifier and a RemoteProposer under one
lease, driving an engine. A router that stops renewing (it died) loses its slots on both
workers after the TTL, while another that makes no call but keeps renewing keeps its
own; a router that was only stalled past the TTL still gets exactly the right tokens.
"""

from __future__ import annotations

import time

import pytest

from specdec.config.config import load_config
from specdec.round.engine import SpeculativeEngine
from specdec.wiring.engine_builder import load_runner
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.requests.request import GenerationRequest
from specdec.verifiers.target_verifier import TargetVerifier
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.lease_renewer import new_lease_id
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.target_servicer import TargetServicer
from specdec_rpc.worker.worker_server import ServerThread

TTL_S = 1.5
NUM_SLOTS = 6
CONFIG = load_config(
    overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": 256}, "serving": {"lease_ttl_s": TTL_S}}
)


@pytest.fixture(scope="module")
def workers():
    """(draft, target) servers on 127.0.0.1 with a short lease TTL."""
    runner = load_runner(CONFIG.models.target, CONFIG.models, CONFIG.cache)
    target = TargetServicer(TargetVerifier(runner), CONFIG.models.target, NUM_SLOTS, lease_ttl_s=TTL_S)
    servers = ServerThread(DraftServicer.from_config(CONFIG)), ServerThread(target)
    yield servers
    for server in servers:
        server.stop()


class Router:
    """A router's clients of both workers under one lease, and the engine they serve."""

    def __init__(self, workers, eos_token_id: int) -> None:
        draft, target = workers
        self.lease_id = new_lease_id()
        self.verifier = RemoteVerifier(target.address, 10.0, lease_id=self.lease_id, lease_ttl_s=TTL_S)
        self.draft = RemoteProposer(draft.address, 10.0, lease_id=self.lease_id, lease_ttl_s=TTL_S)
        proposer = CompositeProposer({"draft": self.draft}, "draft")
        self.engine = SpeculativeEngine(self.verifier, proposer, 3, eos_token_ids=[eos_token_id])

    def open(self, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
        """Start requests and run one round: each now holds a slot on both workers."""
        ids = [self.engine.add_request(GenerationRequest(p, max_new_tokens)) for p in prompts]
        self.engine.step()
        return ids

    def finish(self, ids: list[str]) -> list[list[int]]:
        while self.engine.has_unfinished():
            self.engine.step()
        self.verifier.flush()  # releases are buffered until the next call
        self.draft.flush()
        return [self.engine.result(i).token_ids for i in ids]

    def die(self) -> None:
        """Stop renewing, as a killed replica does (it makes no further call either)."""
        self.verifier.lease.close()
        self.draft.lease.close()

    def close(self) -> None:
        self.verifier.close()
        self.draft.close()


def free_slots(workers) -> tuple[int, int]:
    return tuple(server.servicer.info().free_slots for server in workers)


def wait_for_free_slots(workers, expected: int, timeout_s: float = 15.0) -> float:
    """Seconds until both workers have `expected` free slots (fails after timeout_s)."""
    start = time.monotonic()
    while free_slots(workers) != (expected, expected):
        assert time.monotonic() - start < timeout_s, f"free slots {free_slots(workers)}, expected {expected}"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_router_that_stops_renewing_loses_its_slots_and_one_that_renews_keeps_them(
    workers, tokenizer, prompt_ids, hf_greedy
):
    live, dead = Router(workers, tokenizer.eos_token_id), Router(workers, tokenizer.eos_token_id)
    try:
        expired_before = [server.servicer.info().expired_sequences for server in workers]
        live_ids = live.open(prompt_ids[:2], 16)
        dead.open(prompt_ids[2:5], 16)
        assert free_slots(workers) == (NUM_SLOTS - 5, NUM_SLOTS - 5)
        dead.die()
        elapsed = wait_for_free_slots(workers, NUM_SLOTS - 2)
        assert elapsed < TTL_S + 2.0, elapsed  # the TTL, a reaper period and some scheduling
        time.sleep(2 * TTL_S)  # the live router makes no call, but keeps renewing
        assert free_slots(workers) == (NUM_SLOTS - 2, NUM_SLOTS - 2)
        assert live.verifier.lease.keep_alives > 0 and live.draft.lease.keep_alives > 0
        for server, before in zip(workers, expired_before):
            info = server.servicer.info()
            assert info.expired_sequences - before == 3 and info.lease_ttl_s == TTL_S
        assert live.finish(live_ids) == [hf_greedy(p, 16) for p in prompt_ids[:2]]
        assert free_slots(workers) == (NUM_SLOTS, NUM_SLOTS)
    finally:
        live.close()
        dead.close()


def test_a_stalled_router_whose_lease_lapsed_still_gets_the_right_tokens(workers, tokenizer, prompt_ids, hf_greedy):
    router = Router(workers, tokenizer.eos_token_id)
    try:
        ids = router.open(prompt_ids[:2], 20)
        router.die()  # stalled: no renewal, no call ...
        wait_for_free_slots(workers, NUM_SLOTS)
        # ... until it wakes up: the workers ask for whole histories, and the output is exact
        assert router.finish(ids) == [hf_greedy(p, 20) for p in prompt_ids[:2]]
        assert free_slots(workers) == (NUM_SLOTS, NUM_SLOTS)
    finally:
        router.close()


def test_keep_alive_answers_the_ttl_and_what_the_lease_holds(workers, tokenizer, prompt_ids):
    router = Router(workers, tokenizer.eos_token_id)
    try:
        ids = router.open(prompt_ids[:1], 8)
        assert router.verifier._keep_alive(router.lease_id) == TTL_S
        for server in workers:
            assert server.servicer.leases.keep_alive(router.lease_id) == 1
            assert server.servicer.leases.keep_alive("a-lease-nobody-used") == 0
        router.finish(ids)
    finally:
        router.close()
