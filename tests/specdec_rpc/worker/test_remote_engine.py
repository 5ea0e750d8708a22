"""The engine over gRPC (RemoteVerifier + RemoteProposer to real grpc.aio workers, no Ray) generates
exactly what the in-process engine generates, over the same wire (q, logprobs, sampling, look-ahead
branches). Its faults and releases: test_remote_engine_faults.py."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch

from specdec.round.draft_ahead import DraftAhead
from specdec.round.overlap_choice import LOOK_AHEAD, MICRO_BATCHES
from specdec.verifiers import target_verifier
from specdec.proposers.base import ProposalRequest
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec_rpc.worker import draft_servicer, prob_codec
from specdec_rpc.worker.draft_servicer import load_wire_draft_proposer
from specdec_rpc.worker.history_sync import HistorySender
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc

from remote_workers import CONFIG, MAX_NEW, target_info


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
