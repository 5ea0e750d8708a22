"""WorkerServicer, the base of both worker services, over real gRPC on 127.0.0.1 (no model):
Release frees a sequence in the model, in the history store and in its lease; KeepAlive
renews a lease and says what it holds; GetInfo adds the call counters and lease figures; a
round call's short model step runs on the event loop, a long one (or a tensor-parallel
leader's) on the worker thread."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_server import ServerThread
from specdec_rpc.worker.target_servicer import TargetServicer
from specdec_rpc.worker.worker_servicer import INLINE_MAX_TOKENS, WorkerServicer

TTL_S = 30.0


class Servicer(WorkerServicer, worker_pb2_grpc.DraftWorkerServicer):
    """A worker whose model only records which sequences it freed."""

    def __init__(self) -> None:
        super().__init__("test-worker", TTL_S, WorkerMetrics.off("draft"))
        self.freed: list[str] = []

    def _free(self, seq_id: str) -> None:
        self.freed.append(seq_id)

    def state(self) -> WorkerState:
        return WorkerState(4, 4 - len(self.histories), len(self.leases.table), len(self.histories), 0)

    def info(self) -> worker_pb2.WorkerInfo:
        return self._info(model="fake", num_slots=4)


@pytest.fixture
def served():
    """(servicer, stub) of a started server holding sequences a and b under lease L."""
    servicer = Servicer()
    for seq_id in ("a", "b"):
        servicer.histories.apply(worker_pb2.HistoryDelta(seq_id=seq_id, token_ids=[1, 2]))
    servicer.leases.hold("L", ["a", "b"])
    with ServerThread(servicer) as server:
        channel = grpc.insecure_channel(server.address)
        yield servicer, worker_pb2_grpc.DraftWorkerStub(channel)
        channel.close()


def test_release_frees_the_sequence_in_the_model_its_history_and_its_lease(served):
    servicer, stub = served
    held = stub.KeepAlive(worker_pb2.KeepAliveRequest(lease_id="L"), timeout=10)
    assert (held.held_sequences, held.lease_ttl_s) == (2, TTL_S)
    stub.Release(worker_pb2.ReleaseRequest(seq_ids=["a"], lease_id="L"), timeout=10)
    assert servicer.freed == ["a"]
    assert "a" not in servicer.histories and "b" in servicer.histories
    assert stub.KeepAlive(worker_pb2.KeepAliveRequest(lease_id="L"), timeout=10).held_sequences == 1


def test_get_info_adds_the_call_counters_and_the_lease_figures(served):
    servicer, stub = served
    servicer.stats.record(3)
    info = stub.GetInfo(worker_pb2.InfoRequest(), timeout=10)
    assert (info.model, info.num_slots) == ("fake", 4)
    assert (info.calls, info.sequences, info.max_batch_size) == (1, 3, 3)
    assert (info.lease_ttl_s, info.leases) == (TTL_S, 1)


def threads_of_steps(servicer: WorkerServicer, new_tokens: list[int]) -> tuple[threading.Thread, list]:
    """(the event loop's thread, the thread each step of `new_tokens` new tokens ran on)."""
    async def run():
        return threading.current_thread(), [await servicer._step(n, threading.current_thread) for n in new_tokens]

    return asyncio.run(run())


def test_a_short_step_runs_on_the_event_loop_and_a_longer_one_on_the_worker_thread():
    servicer = Servicer()
    try:
        loop, (short, long) = threads_of_steps(servicer, [INLINE_MAX_TOKENS, INLINE_MAX_TOKENS + 1])
        assert short is loop, "a decode round's step: no hand-off to the worker thread and back"
        assert long is not loop and long.name.startswith("test-worker"), "a prefill never holds the event loop"
    finally:
        servicer.close()


def test_a_tensor_parallel_leader_never_steps_on_the_event_loop():
    """Its step waits for its followers through Ray, which must not block the loop."""
    leader = TargetServicer(verifier=None, model="m", num_slots=1, tensor_parallel_size=2)
    single = TargetServicer(verifier=None, model="m", num_slots=1)
    try:
        loop, (step,) = threads_of_steps(leader, [1])
        assert step is not loop and single.inline_steps
    finally:
        leader.close()
        single.close()
