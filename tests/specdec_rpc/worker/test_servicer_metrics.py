"""The draft and target servicers record their own metrics (WorkerMetrics with fake metric
classes): calls by rpc and status code, compute time, drafted / verified tokens, cache slots,
leases, held sequences and sequences freed by a lapsed lease. Real gRPC on 127.0.0.1, the
bundled models, no Ray."""

from __future__ import annotations

import time

import grpc
import pytest

from specdec.config.config import load_config
from specdec.wiring.engine_builder import load_runner
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.target_verifier import TargetVerifier
from specdec_metrics.worker_metrics import WorkerMetrics
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.history_sync import sampling_to_proto
from specdec_rpc.worker.target_servicer import TargetServicer
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_server import ServerThread

NUM_SLOTS = 4
TTL_S = 2.0  # the target's (the draft keeps the default, far longer than the test)
CONFIG = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": 128}})
GREEDY = sampling_to_proto(SamplingParams())


class Fake:
    def __init__(self, name, description="", tag_keys=(), boundaries=None):
        self.name, self.tag_keys, self.default_tags = name, tag_keys, {}
        self.value, self.by_tag, self.observed = 0.0, {}, []

    def set_default_tags(self, tags):
        self.default_tags = tags

    def inc(self, value=1.0, tags=None):
        self.value += value
        key = tuple(sorted((tags or {}).items()))
        self.by_tag[key] = self.by_tag.get(key, 0.0) + value

    def set(self, value, tags=None):
        self.value = value

    def observe(self, value, tags=None):
        self.observed.append((value, dict(tags or {})))


FAKES = (Fake, Fake, Fake)


def calls(metrics, rpc: str, code: str = "OK") -> float:
    return metrics.calls.by_tag.get((("code", code), ("rpc", rpc)), 0.0)


def wait_until(check, timeout_s: float = 10.0) -> None:
    """The gauges are polled (every second): wait for them."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the worker metrics did not get there"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def draft():
    metrics = WorkerMetrics(FAKES, model=CONFIG.models.target, role="draft")
    servicer = DraftServicer.from_config(CONFIG, metrics)
    with ServerThread(servicer) as server, grpc.insecure_channel(server.address) as channel:
        yield servicer, worker_pb2_grpc.DraftWorkerStub(channel)


@pytest.fixture(scope="module")
def target():
    metrics = WorkerMetrics(FAKES, model=CONFIG.models.target, role="target", rank=0)
    runner = load_runner(CONFIG.models.target, CONFIG.models, CONFIG.cache)
    servicer = TargetServicer(TargetVerifier(runner), CONFIG.models.target, NUM_SLOTS, lease_ttl_s=TTL_S,
                              metrics=metrics)
    with ServerThread(servicer) as server, grpc.insecure_channel(server.address) as channel:
        yield servicer, worker_pb2_grpc.TargetWorkerStub(channel)


def delta(seq_id: str, tokens: list[int]) -> worker_pb2.HistoryDelta:
    return worker_pb2.HistoryDelta(seq_id=seq_id, offset=0, token_ids=tokens, sampling=GREEDY)


def test_the_draft_records_propose_calls_compute_drafted_tokens_and_cache_use(draft, prompt_ids):
    servicer, stub = draft
    m = servicer.metrics
    reply = stub.Propose(worker_pb2.ProposeRequest(
        sequences=[delta("d-a", prompt_ids[0]), delta("d-b", prompt_ids[1])], gammas=[3, 2], lease_id="router-1"))
    drafted = sum(len(d.token_ids) for d in reply.drafts)
    assert drafted == 5 and m.tokens.value == drafted and m.tokens.name == "specdec_worker_draft_tokens"
    assert calls(m, "Propose") == 1
    assert m.compute_time.observed == [(reply.compute_seconds, {"rpc": "Propose"})]
    wait_until(lambda: m.slots_used.value == 2)
    assert (m.slots.value, m.leases.value, m.sequences.value) == (NUM_SLOTS, 1, 2)
    stub.Release(worker_pb2.ReleaseRequest(seq_ids=["d-a", "d-b"], lease_id="router-1"))
    assert calls(m, "Release") == 1
    wait_until(lambda: m.slots_used.value == 0 and m.sequences.value == 0)


def test_a_failed_call_is_counted_with_its_status_code_and_no_compute(draft):
    servicer, stub = draft
    m = servicer.metrics
    before = len(m.compute_time.observed)
    with pytest.raises(grpc.RpcError) as error:
        stub.Propose(worker_pb2.ProposeRequest(sequences=[delta("d-x", [1, 2, 3])], gammas=[], lease_id="router-1"))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert calls(m, "Propose", "INVALID_ARGUMENT") == 1
    assert len(m.compute_time.observed) == before
    stub.KeepAlive(worker_pb2.KeepAliveRequest(lease_id="router-1"))
    stub.GetInfo(worker_pb2.InfoRequest())
    assert calls(m, "KeepAlive") >= 1 and calls(m, "GetInfo") == 1


def test_the_target_records_verify_calls_verified_tokens_and_expired_sequences(target, prompt_ids):
    servicer, stub = target
    m = servicer.metrics
    tags = [x.default_tags for x in vars(m).values() if isinstance(x, Fake)]
    assert tags and all(t == {"model": CONFIG.models.target, "role": "target", "rank": "0"} for t in tags)
    items = [worker_pb2.VerifyItem(history=delta("t-a", prompt_ids[0]), draft_token_ids=[5, 6, 7]),
             worker_pb2.VerifyItem(history=delta("t-b", prompt_ids[1]))]  # plain decoding: nothing to verify
    reply = stub.Verify(worker_pb2.VerifyRequest(items=items, lease_id="router-gone"))
    assert len(reply.outcomes) == 2
    assert m.tokens.name == "specdec_worker_verified_tokens" and m.tokens.value == 3
    assert calls(m, "Verify") == 1 and m.compute_time.observed == [(reply.compute_seconds, {"rpc": "Verify"})]
    wait_until(lambda: m.slots_used.value == 2 and m.sequences.value == 2 and m.leases.value == 1)
    # the router stops renewing: its two sequences are freed by the lease reaper, and counted
    wait_until(lambda: m.expired.value == 2 and m.slots_used.value == 0 and m.sequences.value == 0)
    assert m.leases.value == 0 and m.slots.value == NUM_SLOTS
