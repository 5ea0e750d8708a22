"""The engine over gRPC when workers fail, restart or hold state: restarted workers are refilled
by resync with the same output (seeded sampling included), a down or unreachable worker costs
speculation or fails the round as unavailable, never a wrong token, and releases free the
workers' slots."""

from __future__ import annotations

import dataclasses
import threading
import time

import grpc
import pytest

from specdec.requests.errors import WorkerError
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import VerifyRequest
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.history_sync import HistorySender, sampling_to_proto
from specdec_rpc.worker.lease_renewer import LeaseRenewer
from specdec_rpc.public.public_api import to_stats
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.round_stream import RoundStream
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_server import ServerThread

from remote_workers import CONFIG, MAX_NEW, NUM_SLOTS, restart, target_info, target_servicer


def test_restarted_workers_are_refilled_by_resync_without_changing_the_output(
    remote_engine, workers, prompt_ids, hf_greedy
):
    engine = remote_engine("draft", 3)
    ids = [engine.add_request(GenerationRequest(p, MAX_NEW)) for p in prompt_ids[:2]]
    for _ in range(3):
        engine.step()
    restart(workers)  # same addresses, empty state
    for client in (engine.verifier, engine.proposer.proposers["draft"]):  # past the channels' reconnect backoff:
        grpc.channel_ready_future(client._channel).result(timeout=10)  # this test is about the resync
    while engine.has_unfinished():
        engine.step()
    assert [engine.result(i).token_ids for i in ids] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:2]]
    assert target_info(workers).sequences >= 2, "the new target verified the resynced sequences"
    assert workers["draft"].servicer.stats.sequences >= 2, "the new draft worker drafted again"


def test_a_seeded_sampled_request_survives_worker_restarts_with_the_same_output(remote_engine, workers, prompt_ids):
    """Random draws are keyed by (seed, position, role): a restarted worker draws what the
    lost one would have drawn, and never replays a number it already used."""
    request = GenerationRequest(prompt_ids[2], MAX_NEW, SamplingParams(temperature=1.0, top_p=0.9, seed=41))
    [reference] = remote_engine("draft", 3).generate([request])
    engine = remote_engine("draft", 3)
    seq_id = engine.add_request(request)
    for _ in range(3):
        engine.step()
    restart(workers)
    while engine.has_unfinished():
        engine.step()
    assert engine.result(seq_id).token_ids == reference.token_ids


def test_a_seeded_sampled_request_keeps_its_text_while_its_draft_worker_is_down(remote_engine, workers, prompt_ids):
    """Seeded sampled requests are decoded by the drafter-invariant rule: rounds without
    drafts (the draft worker stopped mid-request, then a fresh one) give the text of
    speculation off."""
    request = GenerationRequest(prompt_ids[0], MAX_NEW, SamplingParams(temperature=0.8, seed=77), ignore_eos=True)
    [reference] = remote_engine("draft", 4).generate([dataclasses.replace(request, mode="off")])
    engine = remote_engine("draft", 4)
    seq_id = engine.add_request(request)
    for _ in range(3):
        engine.step()
    old = workers["draft"]
    old.stop()
    for _ in range(3):
        engine.step()  # the draft is down: these rounds go on without drafts
    host, port = old.address.rsplit(":", 1)
    workers["draft"] = ServerThread(DraftServicer.from_config(CONFIG), host, int(port))
    while engine.has_unfinished():
        engine.step()
    result = engine.result(seq_id)
    assert reference.stats.drafted == 0 and result.stats.drafted > 0
    assert result.token_ids == reference.token_ids


def test_a_q_that_does_not_decode_is_not_trusted_and_fails_nothing(workers, prompt_ids, hf_greedy):
    """A truncated distribution on the wire: that row decodes plainly, the call succeeds."""
    before = target_info(workers).rejected_proposals
    sampled = SamplingParams(temperature=1.0, seed=2)
    broken = worker_pb2.TokenDistribution(dense_f16=b"\x00\x3c" * 10)  # 10 values for a 4096 vocabulary
    with grpc.insecure_channel(workers["target"].address) as channel:
        stub = worker_pb2_grpc.TargetWorkerStub(channel)
        items = [
            worker_pb2.VerifyItem(
                history=worker_pb2.HistoryDelta(seq_id="corrupt", token_ids=prompt_ids[0],
                                                sampling=sampling_to_proto(sampled)),
                draft_token_ids=[5], draft_probs=[broken],
            ),
            worker_pb2.VerifyItem(history=worker_pb2.HistoryDelta(seq_id="fine", token_ids=prompt_ids[1])),
        ]
        corrupt, fine = stub.Verify(worker_pb2.VerifyRequest(items=items)).outcomes
        stub.Release(worker_pb2.ReleaseRequest(seq_ids=["corrupt", "fine"]))
    assert (corrupt.num_accepted, len(corrupt.emitted_token_ids)) == (0, 1)
    assert list(fine.emitted_token_ids) == hf_greedy(prompt_ids[1], 1)
    assert target_info(workers).rejected_proposals == before + 1


def test_an_unreachable_target_is_a_worker_error(prompt_ids):
    """No row caused it: the engine fails the round's batch with UNAVAILABLE instead of
    retrying row by row."""
    verifier = RemoteVerifier.__new__(RemoteVerifier)  # skip the readiness wait of __init__
    verifier.address, verifier.timeout_s = "127.0.0.1:1", 2.0
    verifier._channel = grpc.insecure_channel(verifier.address)
    verifier._stub = worker_pb2_grpc.TargetWorkerStub(verifier._channel)
    verifier._rounds = RoundStream(lambda requests: verifier._stub.VerifyStream(requests), verifier.timeout_s)
    verifier._sender, verifier._held, verifier._released = HistorySender(), {}, []
    verifier.lease = LeaseRenewer("test-lease", lambda lease_id: 0.0, ttl_s=5.0)  # not started
    with pytest.raises(WorkerError, match="unavailable"):
        verifier.verify([VerifyRequest("a", prompt_ids[0], [], SamplingParams())])
    verifier._channel.close()


def test_the_verifier_says_when_its_target_is_down_even_when_idle_and_when_it_is_back(prompt_ids):
    """Keep-alives (every ttl / 3 of silence) notice a dead target without any request;
    the next call that succeeds clears it (health follows unavailable_reason)."""
    target = ServerThread(target_servicer())
    host, port = target.address.rsplit(":", 1)
    verifier = RemoteVerifier(target.address, timeout_s=2.0, lease_ttl_s=0.6)
    try:
        verifier.lease.ttl_s = 0.6  # the worker states 5 s; renew fast here
        assert verifier.unavailable_reason is None
        target.stop()
        deadline = time.monotonic() + 5
        while verifier.unavailable_reason is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "is unavailable (UNAVAILABLE" in verifier.unavailable_reason
        target = ServerThread(target_servicer(), host, int(port))
        deadline = time.monotonic() + 5  # the channel reconnects within its 2 s backoff
        while verifier.unavailable_reason is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert verifier.unavailable_reason is None, "a keep-alive reached the target again"
        [result] = verifier.verify([VerifyRequest("a", prompt_ids[0], [], SamplingParams())])
        assert len(result.emitted) == 1
    finally:
        verifier.close()
        target.stop()


def test_a_round_waits_for_a_target_that_comes_back_elsewhere_and_the_output_is_unchanged(
    remote_engine, prompt_ids, hf_greedy, tokenizer
):
    """The target dies between rounds; its replacement serves at another address after a
    while: the round waits (recovery_s), resends whole histories to it, and the requests
    finish with the target's greedy output."""
    old = ServerThread(target_servicer())
    where = {"address": old.address}
    verifier = RemoteVerifier(old.address, timeout_s=5.0, resolve=lambda: where["address"], recovery_s=30.0)
    engine = remote_engine("draft", 3)
    engine.verifier.close()
    engine.verifier = verifier
    ids = [engine.add_request(GenerationRequest(p, MAX_NEW)) for p in prompt_ids[:2]]
    engine.step()
    old.stop()
    where["address"] = None  # being re-formed

    def come_back():
        time.sleep(1.0)
        where["new"] = ServerThread(target_servicer())
        where["address"] = where["new"].address


    threading.Thread(target=come_back).start()
    try:
        while engine.has_unfinished():
            engine.step()
        assert [engine.result(i).token_ids for i in ids] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:2]]
        assert verifier.recoveries >= 1 and verifier.address == where["new"].address
        assert verifier.unavailable_reason is None
    finally:
        verifier.close()
        where["new"].stop()


def test_a_round_fails_at_once_when_no_target_is_coming(prompt_ids):
    target = ServerThread(target_servicer())
    verifier = RemoteVerifier(target.address, timeout_s=5.0, resolve=lambda: "", recovery_s=30.0)
    target.stop()
    start = time.monotonic()
    try:
        with pytest.raises(WorkerError):
            verifier.verify([VerifyRequest("a", prompt_ids[0], [], SamplingParams())])
        assert time.monotonic() - start < 5.0
    finally:
        verifier.close()


def test_release_frees_the_slots_on_both_workers(remote_engine, workers, prompt_ids):
    engine = remote_engine("draft", 4)
    verifier, draft = engine.verifier, engine.proposer.proposers["draft"]
    ids = [engine.add_request(GenerationRequest(p, 8)) for p in prompt_ids[:3]]
    engine.step()
    assert verifier.num_free_slots == NUM_SLOTS - 3
    assert verifier.info().free_slots == NUM_SLOTS - 3 and draft.info().free_slots == NUM_SLOTS - 3
    engine.abort(ids[0])
    assert verifier.num_free_slots == NUM_SLOTS - 2
    while engine.has_unfinished():
        engine.step()
    assert verifier.num_free_slots == NUM_SLOTS
    assert verifier.info().free_slots == NUM_SLOTS and draft.info().free_slots == NUM_SLOTS


def test_a_release_rides_on_the_next_rounds_calls_which_free_its_slots_first(remote_engine, workers, prompt_ids,
                                                                             monkeypatch):
    engine = remote_engine("draft", 4)
    verifier, draft = engine.verifier, engine.proposer.proposers["draft"]
    ids = [engine.add_request(GenerationRequest(p, 24)) for p in prompt_ids[:2]]
    servicers = {name: workers[name].servicer for name in ("draft", "target")}
    while not all(client._sender.wire_id(ids[0]) in servicers[name].histories
                  for name, client in (("draft", draft), ("target", verifier))):
        engine.step()  # until both workers hold the sequence
    free = {"draft": servicers["draft"].proposer.num_free_slots, "target": servicers["target"].verifier.num_free_slots}

    def no_release_call(*_):
        raise AssertionError("a round sent a Release call of its own")

    for client in (verifier, draft):
        monkeypatch.setattr(client, "flush", no_release_call)
    monkeypatch.setattr(draft, "_send_releases", no_release_call)
    engine.abort(ids[0])
    engine.step()
    for name, client in (("draft", draft), ("target", verifier)):
        assert client._sender.wire_id(ids[0]) not in servicers[name].histories, name
        assert client._released == [], name
    assert servicers["draft"].proposer.num_free_slots == free["draft"] + 1
    assert servicers["target"].verifier.num_free_slots == free["target"] + 1


def test_the_releases_a_failed_verify_carried_are_sent_again_with_the_next_call(remote_engine):
    verifier = remote_engine().verifier
    verifier.release("gone")
    with pytest.raises(grpc.RpcError):
        verifier.verify([VerifyRequest("bad", [verifier.vocab_size + 5], [], SamplingParams())])
    assert verifier._released == [verifier._sender.wire_id("gone")], "kept: the target may not have freed it"
    verifier.release("bad")
    verifier.flush()
    assert verifier._released == []


def test_an_unreachable_draft_worker_only_turns_speculation_off(remote_engine, prompt_ids, hf_greedy):
    engine = remote_engine("draft", 4, draft_address="127.0.0.1:1", timeout_s=2.0)
    [result] = engine.generate([GenerationRequest(prompt_ids[0], 12)])
    assert result.token_ids == hf_greedy(prompt_ids[0], 12)
    assert result.stats.drafted == 0
    rounds_that_could_speculate = result.stats.rounds - 1  # the last round has no room for drafted tokens
    assert engine.proposer.proposers["draft"].failures == rounds_that_could_speculate
    # and says so: the request did not speculate, the proposer tells why
    assert result.stats.speculation_unavailable and not to_stats(result.stats).speculation_enabled
    assert "127.0.0.1:1" in engine.proposer.unavailable("draft") and engine.proposer.unavailable("ngram") is None


def test_a_draft_worker_that_dies_is_found_again_elsewhere_and_speculation_resumes(
    workers, remote_engine, prompt_ids, hf_greedy
):
    """The draft dies mid-generation: rounds go on without drafts (no call per round while it
    is down, the reason says so); its replacement serves at another address, which the
    resolver names; the client switches to it, resends whole histories, and drafts again."""
    old = ServerThread(DraftServicer.from_config(CONFIG))
    where = {"address": old.address}
    engine = remote_engine("draft", 3, timeout_s=5.0)
    draft = engine.proposer.proposers["draft"]
    draft.close()
    draft = RemoteProposer(old.address, timeout_s=5.0, resolve=lambda: where["address"])
    engine.proposer.proposers["draft"] = draft
    ids = [engine.add_request(GenerationRequest(p, MAX_NEW)) for p in prompt_ids[:2]]
    engine.step()
    old.stop()
    where["address"] = None  # restarting
    engine.step()
    for _ in range(2):
        engine.step()
    assert "is down" in draft.unavailable_reason and draft.failures == 3
    new = ServerThread(DraftServicer.from_config(CONFIG))
    try:
        where["address"] = new.address
        deadline = time.monotonic() + 10
        while draft.reconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert draft.reconnects == 1 and draft.address == new.address and draft.unavailable_reason is None
        drafted_before = engine.stats.drafted
        while engine.has_unfinished():
            engine.step()
        assert [engine.result(i).token_ids for i in ids] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:2]]
        assert engine.stats.drafted > drafted_before and new.servicer.stats.sequences >= 2
        assert draft.reconnector.searches == 1, "one search found it; rounds while down made no calls"
    finally:
        draft.close()
        new.stop()


def test_target_errors_propagate_with_their_status_code(remote_engine):
    verifier = remote_engine().verifier
    with pytest.raises(grpc.RpcError) as error:
        verifier.verify([VerifyRequest("bad", [verifier.vocab_size + 5], [], SamplingParams())])
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "vocab_size" in error.value.details()
    verifier.release("bad")  # what the router does with a failed request


def test_a_reused_seq_id_with_another_history_starts_from_a_fresh_state(workers, prompt_ids, hf_greedy):
    """Workers drop the state of a sequence whose new history does not extend the old one."""
    with grpc.insecure_channel(workers["target"].address) as channel:
        stub = worker_pb2_grpc.TargetWorkerStub(channel)
        for prompt in (prompt_ids[0], prompt_ids[5], prompt_ids[1]):  # stale caches would change these tokens
            item = worker_pb2.VerifyItem(history=worker_pb2.HistoryDelta(seq_id="reused", token_ids=prompt))
            [outcome] = stub.Verify(worker_pb2.VerifyRequest(items=[item])).outcomes
            assert list(outcome.emitted_token_ids) == hf_greedy(prompt, 1)
        stub.Release(worker_pb2.ReleaseRequest(seq_ids=["reused"]))


def test_several_clients_share_a_target_without_sharing_state(workers, prompt_ids, hf_greedy):
    first, second = RemoteVerifier(workers["target"].address), RemoteVerifier(workers["target"].address, slot_budget=2)
    free_before = workers["target"].servicer.info().free_slots
    try:
        assert (first.num_free_slots, second.num_free_slots) == (NUM_SLOTS, 2)
        for verifier, prompt in ((first, prompt_ids[0]), (second, prompt_ids[1])):
            [result] = verifier.verify([VerifyRequest("seq-0", list(prompt), [], SamplingParams())])
            assert result.emitted == hf_greedy(prompt, 1)
        assert workers["target"].servicer.info().free_slots == free_before - 2, "one slot per client"
    finally:
        for verifier in (first, second):
            verifier.release("seq-0")
            verifier.close()
    assert workers["target"].servicer.info().free_slots == free_before
