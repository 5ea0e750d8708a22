"""RemoteProposer's deadline over real gRPC on 127.0.0.1 (a draft worker with the bundled
draft, no Ray; the target in-process).

A draft worker that stops answering (its event loop frozen, as a SIGSTOP freezes its
process) costs a round at most the draft deadline, and only once: later rounds skip it
without waiting while the late call runs; every output is the target's greedy output and
speculation resumes when the worker answers. A call whose deadline passed before the worker
could run it changes nothing there. A worker that keeps missing is taken for down (the
reason says why) and is used again once a probe answers in time.
"""

from __future__ import annotations

import time

import pytest

from specdec.config.config import load_config
from specdec.round.draft_deadline import DraftDeadline
from specdec.round.engine import SpeculativeEngine
from specdec.wiring.engine_builder import load_runner
from specdec.proposers.base import ProposalRequest
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.target_verifier import TargetVerifier
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.history_sync import HistorySender
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_server import ServerThread

import grpc

CONFIG = load_config(overrides={"cache": {"num_slots": 8, "max_seq_len": 256}})
MAX_NEW = 40
FREEZE_S = 2.5


@pytest.fixture(scope="module")
def worker():
    server = ServerThread(DraftServicer.from_config(CONFIG))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def verifier():
    return TargetVerifier(load_runner(CONFIG.models.target, CONFIG.models, CONFIG.cache))


def freeze(server: ServerThread, seconds: float) -> None:
    """Block the worker's event loop (nothing it serves answers) for `seconds`, from now."""
    server._loop.call_soon_threadsafe(time.sleep, seconds)
    time.sleep(0.05)  # the loop is blocked before the caller's next call


def test_a_frozen_draft_costs_one_deadline_then_no_wait_and_speculation_resumes(worker, verifier, prompt_ids,
                                                                                 hf_greedy, tokenizer):
    draft = RemoteProposer(worker.address, timeout_s=10.0)
    engine = SpeculativeEngine(verifier, draft, 4, eos_token_ids=[tokenizer.eos_token_id])
    prompts = prompt_ids[:3]
    ids = [engine.add_request(GenerationRequest(p, MAX_NEW)) for p in prompts]
    try:
        for _ in range(3):
            engine.step()
        drafted, budget, missed = engine.stats.drafted, draft.deadline.budget_s(), draft.deadline.missed_calls
        assert drafted > 0 and budget < 1.0
        freeze(worker, FREEZE_S)
        frozen_at, steps = time.monotonic(), []
        for _ in range(5):
            start = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - start)
        assert time.monotonic() - frozen_at < FREEZE_S, "the rounds ran while the worker was frozen"
        assert engine.stats.drafted == drafted, "no drafts while the worker is frozen"
        assert max(steps) < budget + 0.5, (budget, steps)
        assert draft.deadline.missed_calls == missed + 1, "one round waited for its drafts; the others skipped it"
        assert "missed its deadline" in draft.unavailable_reason
        time.sleep(max(0.0, frozen_at + FREEZE_S + 0.2 - time.monotonic()))
        while engine.has_unfinished():
            engine.step()
        assert [engine.result(i).token_ids for i in ids] == [hf_greedy(p, MAX_NEW) for p in prompts]
        assert engine.stats.drafted > drafted, "speculation resumed when the worker answered"
        assert draft.unavailable_reason is None and draft.reconnects == 0
    finally:
        draft.close()


def test_a_call_whose_deadline_passed_while_the_worker_was_frozen_changes_nothing(worker):
    sender = HistorySender("gave-up/")
    request = worker_pb2.ProposeRequest(sequences=[sender.delta("s", [5, 6, 7], SamplingParams())], gammas=[2])
    stub = worker_pb2_grpc.DraftWorkerStub(grpc.insecure_channel(worker.address))
    freeze(worker, 1.0)
    with pytest.raises(grpc.RpcError) as late:
        stub.Propose(request, timeout=0.3)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(1.0)  # the worker runs again, the late call with it
    assert "gave-up/s" not in worker.servicer.histories, "a late call's deltas are not applied"


def test_a_draft_that_keeps_missing_is_down_until_a_probe_answers_in_time(worker, prompt_ids):
    draft = RemoteProposer(worker.address, timeout_s=10.0)
    draft.deadline = DraftDeadline(floor_s=0.05, cap_s=0.1, misses_to_open=2)
    requests = [ProposalRequest("k", prompt_ids[0], SamplingParams(), gamma=3)]
    try:
        assert len(draft.propose(requests)[0]) > 0
        reasons = []
        for _ in range(2):  # two calls in a row miss (the late one ends in between)
            freeze(worker, 0.3)
            assert len(draft.propose(requests)[0]) == 0
            reasons.append(draft.unavailable_reason)
            time.sleep(0.5)
        assert draft.deadline.missed_calls == 2 and draft.reconnector.searches == 1
        assert "missed its deadline of" in reasons[0] and "is down" not in reasons[0]
        assert "is down" in reasons[1] and "missed its deadline 2 times in a row" in reasons[1]
        deadline = time.monotonic() + 5.0
        while draft.reconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert draft.reconnects == 1, "a probe that answered in time ended the outage"
        assert len(draft.propose(requests)[0]) > 0, "drafts again, from the whole history"
    finally:
        draft.close()


def test_releases_ride_on_the_next_call_and_a_late_one_sends_them_again(worker, prompt_ids):
    """A late call may or may not free what it carried: the next call carries it again (the
    worker ignores ids it already freed)."""
    draft = RemoteProposer(worker.address, timeout_s=10.0)
    draft.deadline = DraftDeadline(floor_s=0.05, cap_s=0.1, misses_to_open=5)
    rows = [ProposalRequest(seq_id, prompt_ids[i], SamplingParams(), gamma=2) for i, seq_id in enumerate("rs")]
    try:
        assert all(len(d) > 0 for d in draft.propose(rows))
        free, wire = worker.servicer.proposer.num_free_slots, draft._sender.wire_id("r")
        draft.release("r")
        freeze(worker, 0.3)
        assert len(draft.propose(rows[1:])[0]) == 0, "late: no drafts this round"
        assert draft._released == [wire], "kept for the next call"
        time.sleep(0.5)  # the late call ran, and freed r
        assert wire not in worker.servicer.histories
        assert len(draft.propose(rows[1:])[0]) > 0 and draft._released == []
        assert worker.servicer.proposer.num_free_slots == free + 1
    finally:
        draft.close()
