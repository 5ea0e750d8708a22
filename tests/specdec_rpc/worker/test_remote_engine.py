"""The engine over gRPC (RemoteVerifier + RemoteProposer to real grpc.aio workers, no Ray) generates
exactly what the in-process engine generates, survives worker restarts and frees slots on release."""

from __future__ import annotations

import dataclasses
import threading
import time

import grpc
import pytest
import torch

from specdec.config.config import load_config
from specdec.round.draft_ahead import DraftAhead
from specdec.round.overlap_choice import LOOK_AHEAD, MICRO_BATCHES
from specdec.round.engine import SpeculativeEngine
from specdec.verifiers import target_verifier
from specdec.requests.errors import WorkerError
from specdec.proposers.base import ProposalRequest
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.proposers.ngram_proposer import NgramProposer
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import VerifyRequest
from specdec_rpc.worker import draft_servicer, prob_codec
from specdec_rpc.worker.draft_servicer import DraftServicer, load_wire_draft_proposer
from specdec_rpc.worker.history_sync import HistorySender, sampling_to_proto
from specdec_rpc.worker.lease_renewer import LeaseRenewer
from specdec_rpc.public.public_api import to_stats
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.round_stream import RoundStream
from specdec_rpc.worker.target_servicer import TargetServicer
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_server import ServerThread
import worker_slots

MAX_NEW = 32
NUM_SLOTS = 8
CONFIG = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": 256}})


def target_servicer() -> TargetServicer:
    return worker_slots.target_servicer(CONFIG)


@pytest.fixture(scope="module")
def workers():
    """A draft and a target worker on 127.0.0.1, each on its own event loop thread."""
    workers = {"draft": ServerThread(DraftServicer.from_config(CONFIG)), "target": ServerThread(target_servicer())}
    yield workers  # a test may replace a worker (restart); the current ones are stopped
    for server in workers.values():
        server.stop()


@pytest.fixture
def remote_engine(workers, tokenizer):
    """make(proposer, gamma) -> an engine whose verifier and draft proposer are gRPC clients."""
    clients = []

    def make(proposer: str = "draft", gamma: int = 4, draft_address: str | None = None, timeout_s: float = 30.0,
             draft_ahead: DraftAhead | None = None, prefill_chunk_tokens: int | None = None):
        verifier = RemoteVerifier(workers["target"].address, timeout_s)
        draft = RemoteProposer(draft_address or workers["draft"].address, timeout_s)
        clients.extend([verifier, draft])
        composite = CompositeProposer({"draft": draft, "ngram": NgramProposer()}, proposer)
        return SpeculativeEngine(verifier, composite, gamma, eos_token_ids=[tokenizer.eos_token_id],
                                 draft_ahead=draft_ahead, prefill_chunk_tokens=prefill_chunk_tokens)

    yield make
    for client in clients:
        client.close()


def target_info(workers):
    return workers["target"].servicer.info()


@pytest.mark.parametrize("proposer, gamma", [("draft", 4), ("ngram", 4), ("draft", 0)])
def test_greedy_output_equals_the_target_alone(remote_engine, workers, prompt_ids, hf_greedy, proposer, gamma):
    engine = remote_engine(proposer, gamma)
    prompts = prompt_ids[:3]
    before = target_info(workers)
    results = engine.generate([GenerationRequest(p, MAX_NEW) for p in prompts])
    assert [r.token_ids for r in results] == [hf_greedy(p, MAX_NEW) for p in prompts]
    if gamma:
        assert engine.stats.accepted > 0
    after = target_info(workers)
    assert after.sequences - before.sequences == engine.stats.rounds, "each round of each sequence, once"
    assert after.calls - before.calls < engine.stats.rounds, "rounds of different sequences share a call"
    assert after.max_batch_size >= 3


def test_greedy_output_equals_the_in_process_engine(remote_engine, make_engine, prompt_ids):
    prompts = [GenerationRequest(p, MAX_NEW) for p in prompt_ids[:4]]
    local = make_engine("draft", gamma=4).engine.generate(prompts)
    remote = remote_engine("draft", 4).generate(prompts)
    assert [r.token_ids for r in remote] == [r.token_ids for r in local]
    assert [r.stats.accepted for r in remote] == [r.stats.accepted for r in local]


def test_logprobs_over_grpc_equal_the_in_process_engines(remote_engine, make_engine, prompt_ids):
    """The target worker reports each emitted token's logprob and alternatives (greedy and seeded)."""
    samplings = [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=5)]
    prompts = [GenerationRequest(p, 12, s, logprobs=2) for p, s in zip(prompt_ids[:2], samplings)]
    local = make_engine("draft", gamma=4).engine.generate(prompts)
    remote = remote_engine("draft", 4).generate(prompts)
    for a, b in zip(remote, local):
        assert a.token_ids == b.token_ids and [t.token_id for t in a.logprobs] == a.token_ids
        assert [t.logprob for t in a.logprobs] == pytest.approx([t.logprob for t in b.logprobs], abs=1e-5)
        assert [len(t.top) for t in a.logprobs] == [2] * 12


def test_prompt_logprobs_read_in_chunks_over_grpc_equal_the_in_process_engines(remote_engine, make_engine,
                                                                              prompt_ids):
    """The target worker reports prompt tokens' logprobs chunk by chunk; the first token has none."""
    prompts = [GenerationRequest(p, 4, prompt_logprobs=2) for p in prompt_ids[:2]]
    local = make_engine("draft", gamma=4).engine.generate(prompts)
    remote = remote_engine("draft", 4, prefill_chunk_tokens=7).generate(prompts)
    for a, b, prompt in zip(remote, local, prompt_ids):
        assert a.prompt_logprobs[0] is None and [t.token_id for t in a.prompt_logprobs[1:]] == list(prompt[1:])
        assert [t.logprob for t in a.prompt_logprobs[1:]] == pytest.approx(
            [t.logprob for t in b.prompt_logprobs[1:]], abs=1e-5)
        assert [[i for i, _ in t.top] for t in a.prompt_logprobs[1:]] == [[i for i, _ in t.top]
                                                                          for t in b.prompt_logprobs[1:]]


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.8, seed=7), SamplingParams(temperature=0.9, top_k=12, seed=3)],
    ids=["dense-q", "sparse-q"],
)
def test_a_seeded_sampled_request_repeats_exactly_and_shares_rounds_with_greedy_ones(
    remote_engine, prompt_ids, hf_greedy, sampling
):
    runs = []
    for _ in range(2):
        engine = remote_engine("draft", 4)
        requests = [GenerationRequest(prompt_ids[0], MAX_NEW, sampling), GenerationRequest(prompt_ids[1], MAX_NEW)]
        runs.append(engine.generate(requests))
    (sampled_1, greedy_1), (sampled_2, _) = runs
    assert sampled_1.token_ids == sampled_2.token_ids
    assert sampled_1.stats.accepted > 0, "draft tokens are accepted under sampling too"
    assert greedy_1.token_ids == hf_greedy(prompt_ids[1], MAX_NEW)


def test_sampling_values_beyond_float32_are_served_as_in_process(remote_engine, make_engine, prompt_ids):
    """The workers sample with the router's doubles: a temperature of 1e39 or a top_p of
    1e-50 (infinity and 0 in float32) gives the in-process engine's seeded output."""
    samplings = [SamplingParams(temperature=1e39, seed=5), SamplingParams(temperature=1.0, top_p=1e-50, seed=6),
                 SamplingParams(temperature=1e-300, seed=7), SamplingParams(temperature=0.8, top_p=1 - 2**-40, seed=8)]
    requests = [GenerationRequest(prompt_ids[i], 8, s) for i, s in enumerate(samplings)]
    local = make_engine("draft", gamma=0).engine.generate(requests)
    remote = remote_engine("draft", 0).generate(requests)
    assert [r.token_ids for r in remote] == [r.token_ids for r in local]


def test_penalties_and_logit_bias_are_processed_by_both_workers_as_in_process(remote_engine, make_engine, prompt_ids):
    """The workers learn where each prompt ends (the penalties count the output only): the
    remote engine's output and acceptance equal the in-process engine's, greedy and seeded."""
    samplings = [SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, logit_bias={13: 2.0}),
                 SamplingParams(temperature=0.8, seed=4, presence_penalty=1.0, min_p=0.05)]
    requests = [GenerationRequest(prompt_ids[i], MAX_NEW, s) for i, s in enumerate(samplings)]
    local = make_engine("draft", gamma=4).engine.generate(requests)
    remote = remote_engine("draft", 4).generate(requests)
    assert [r.token_ids for r in remote] == [r.token_ids for r in local]
    assert [r.stats.accepted for r in remote] == [r.stats.accepted for r in local]


@pytest.mark.parametrize("way, prompts", [(LOOK_AHEAD, 1), (MICRO_BATCHES, 4)], ids=["look-ahead", "micro-batches"])
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_drafting_ahead_while_the_remote_target_verifies_keeps_the_output(
    remote_engine, prompt_ids, hf_greedy, proposer, way, prompts
):
    """The verify call runs while the draft worker drafts: greedy output is still the
    target's, and a seeded sampled request repeats exactly."""
    micro_batches = way == MICRO_BATCHES
    engine = remote_engine(proposer, 4, draft_ahead=DraftAhead(0.0, way, 3))
    greedy = [GenerationRequest(p, MAX_NEW) for p in prompt_ids[:prompts]]
    assert [r.token_ids for r in engine.generate(greedy)] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:prompts]]
    ahead = engine.draft_ahead
    assert (ahead.stored > 0) if micro_batches else (0 < ahead.hits <= ahead.rows_ahead)
    if proposer == "draft" and not micro_batches:
        assert ahead.rejection_hits > 0, "the draft worker's branches after a rejection came over the wire"
    sampled = GenerationRequest(prompt_ids[2], MAX_NEW, SamplingParams(temperature=0.9, seed=12), ignore_eos=True)
    runs = [remote_engine(proposer, 4, draft_ahead=DraftAhead(0.0, way, 3)).generate([sampled])
            for _ in range(2)]
    assert runs[0][0].token_ids == runs[1][0].token_ids


@pytest.mark.parametrize("micro_batches", [False, True], ids=["plain", "micro-batches"])
def test_prompts_read_in_chunks_by_the_remote_workers_give_the_target_alone(
    remote_engine, prompt_ids, hf_greedy, micro_batches
):
    """Chunked prefill over gRPC: the chunks travel as cut histories (deltas), the output is the target's."""
    ahead = DraftAhead(0.0, MICRO_BATCHES) if micro_batches else None
    engine = remote_engine("draft", 4, draft_ahead=ahead, prefill_chunk_tokens=7)
    results = engine.generate([GenerationRequest(p, MAX_NEW) for p in prompt_ids[:3]])
    assert [r.token_ids for r in results] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:3]]
    assert engine.stats.accepted > 0


def test_restarted_workers_are_refilled_by_resync_without_changing_the_output(
    remote_engine, workers, prompt_ids, hf_greedy
):
    engine = remote_engine("draft", 3)
    ids = [engine.add_request(GenerationRequest(p, MAX_NEW)) for p in prompt_ids[:2]]
    for _ in range(3):
        engine.step()
    for name, make_servicer in (("target", target_servicer), ("draft", lambda: DraftServicer.from_config(CONFIG))):
        old = workers[name]
        old.stop()
        host, port = old.address.rsplit(":", 1)
        workers[name] = ServerThread(make_servicer(), host, int(port))  # same address, empty state
    for client in (engine.verifier, engine.proposer.proposers["draft"]):  # past the channels' reconnect backoff:
        grpc.channel_ready_future(client._channel).result(timeout=10)  # this test is about the resync
    while engine.has_unfinished():
        engine.step()
    assert [engine.result(i).token_ids for i in ids] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:2]]
    assert target_info(workers).sequences >= 2, "the new target verified the resynced sequences"
    assert workers["draft"].servicer.stats.sequences >= 2, "the new draft worker drafted again"


def restart(workers):
    """Replace both workers by fresh ones on the same addresses (all their state is lost)."""
    for name, make_servicer in (("target", target_servicer), ("draft", lambda: DraftServicer.from_config(CONFIG))):
        old = workers[name]
        old.stop()
        host, port = old.address.rsplit(":", 1)
        workers[name] = ServerThread(make_servicer(), host, int(port))


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

    import threading

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


def test_worker_info_describes_the_model_and_capacity(remote_engine, workers):
    engine = remote_engine()
    info = engine.verifier.info()
    assert (info.model, info.vocab_size, info.num_slots, info.tensor_parallel_size) == ("bundled:target", 4096, 8, 1)
    assert (engine.verifier.vocab_size, engine.verifier.max_seq_len) == (4096, 256)
    draft = engine.proposer.proposers["draft"].info()
    assert (draft.model, draft.vocab_size, draft.max_seq_len, draft.num_slots) == ("bundled:draft", 4096, 256, 8)
    assert (info.runner, draft.runner) == ("specdec", "specdec")  # the bundled pair is Llama-family


def test_q_reaches_the_targets_sampler_bit_exactly_as_the_draft_made_it_never_decoded_between(
        remote_engine, workers, prompt_ids, monkeypatch):
    """The router passes the draft's q on as the bytes it received: the target's rejection
    sampler gets bit-exactly the (float16-exact) q the draft sampled from; q is encoded only
    in the draft worker's step (on its event loop or its thread) and decoded only in the
    target worker's; a greedy row next to a sampled one carries no q and is verified with a
    one-hot q."""
    made, seen, threads = {}, [], {"encode": set(), "decode": set()}
    proposer, verifier = workers["draft"].servicer.proposer, workers["target"].servicer.verifier

    def drafting(requests, propose=proposer.propose):
        proposal = propose(requests)
        for request, drafts in zip(requests, proposal):  # keyed by (sequence, history length)
            made[request.seq_id.split("/")[-1], len(request.token_ids)] = drafts
        return proposal

    def verifying(requests, verify=verifier.verify):
        seen.append([(r.seq_id.split("/")[-1], len(r.token_ids), r.sampling.is_greedy) for r in requests])
        return verify(requests)

    def sampling(logits, ids, num_drafted, q, batch, sample=target_verifier.rejection_sample):
        seen[-1] = [(*row, ids[i, : int(num_drafted[i])].tolist(), None if q is None else q[i, : int(num_drafted[i])])
                    for i, row in enumerate(seen[-1])]
        return sample(logits, ids, num_drafted, q, batch)

    def on_thread(kind, fn):
        def call(*args):
            thread = threading.current_thread()
            loops = {workers[name]._thread: name for name in ("draft", "target")}  # each server's event loop
            threads[kind].add(f"{loops[thread]}-loop" if thread in loops else thread.name.rsplit("_", 1)[0])
            return fn(*args)
        return call

    monkeypatch.setattr(proposer, "propose", drafting)
    monkeypatch.setattr(verifier, "verify", verifying)
    monkeypatch.setattr(target_verifier, "rejection_sample", sampling)
    monkeypatch.setattr(prob_codec, "encode_rows", on_thread("encode", prob_codec.encode_rows))
    monkeypatch.setattr(draft_servicer, "encode_rows", on_thread("encode", prob_codec.encode_rows))
    monkeypatch.setattr(prob_codec, "decode_rows", on_thread("decode", prob_codec.decode_rows))
    engine = remote_engine("draft", 3)
    engine.generate([GenerationRequest(prompt_ids[0], 16, sampling=SamplingParams(temperature=1.0, seed=4)),
                     GenerationRequest(prompt_ids[1], 16)])
    compared = 0
    sampled_calls = [call for call in seen if len(call[0]) == 5]  # an all-greedy call takes greedy_verdicts instead
    for seq_id, length, greedy, ids, q in (row for call in sampled_calls for row in call):
        if not ids:
            continue
        drafts = made[seq_id, length]
        assert drafts.token_ids == ids
        if greedy:
            one_hot = torch.nn.functional.one_hot(torch.tensor(ids), q.shape[-1]).float()
            assert drafts.q is None and torch.equal(q, one_hot)
        else:
            assert torch.equal(q, drafts.q) and torch.equal(q, q.half().float()), "bit-exact, float16-exact"
            compared += 1
    assert compared >= 2 and any(row[2] for call in sampled_calls for row in call)
    assert threads["encode"] <= {"draft-loop", "draft-worker"} and threads["decode"] <= {"target-loop", "target-worker"}
    assert threads["encode"] and threads["decode"]


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=40, seed=3)],
                         ids=["greedy", "sampled"])
def test_the_draft_workers_look_ahead_branches_equal_the_in_process_proposers(workers, prompt_ids, sampling):
    """Look-ahead over gRPC: the same branches (verdict, drafts and q, float16-exact) as the
    draft model in this process."""
    local = load_wire_draft_proposer(CONFIG)
    remote = RemoteProposer(workers["draft"].address)
    try:
        found = []
        for proposer in (local, remote):
            history = list(prompt_ids[3])
            drafted = proposer.propose([ProposalRequest("ahead", history, sampling, gamma=4)])[0].token_ids
            ask = ProposalRequest("ahead", [*history, *drafted], sampling, gamma=3)
            found.append(proposer.look_ahead([ask], [len(drafted)], branches=6)[0])
        (mine, theirs) = found
        assert len(theirs) == 6
        assert [(b.base_length, b.token_id, b.token_ids) for b in theirs] == \
            [(b.base_length, b.token_id, b.token_ids) for b in mine]
        for here, there in zip(mine, theirs):
            assert (here.probs is None) == (there.probs is None) == sampling.is_greedy
            if here.probs is not None:  # the worker's q as it sent it, decoded here to compare
                assert torch.equal(here.probs, there.probs.decode(4096))
    finally:
        remote.release("ahead")
        remote.close()


def test_a_look_ahead_with_bad_counts_is_refused_and_costs_no_request(workers, prompt_ids):
    """Internal input is checked too: unverified counts that do not match the sequences, or
    more branches than the worker allows, are INVALID_ARGUMENT (the router then simply
    has no look-ahead that round)."""
    stub = worker_pb2_grpc.DraftWorkerStub(grpc.insecure_channel(workers["draft"].address))
    delta = HistorySender().delta("bad-ahead", list(prompt_ids[0]), SamplingParams())
    for fields in ({"unverified": [1, 2]}, {"unverified": [1], "branches": 99}):
        with pytest.raises(grpc.RpcError) as error:
            stub.Propose(worker_pb2.ProposeRequest(sequences=[delta], gammas=[2], lease_id="l", **fields), timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    proposer = RemoteProposer(workers["draft"].address)
    try:
        ask = ProposalRequest("never-drafted", list(prompt_ids[0]), SamplingParams(), gamma=2)
        assert proposer.look_ahead([ask], [len(prompt_ids[0])], branches=2) == [[]], "more drafts than history"
        assert proposer.failures == 0
    finally:
        proposer.release("never-drafted")
        proposer.close()
