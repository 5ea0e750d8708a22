"""Preemption, served (real grpc.aio workers on 127.0.0.1, no Ray): the router admits requests on
their next round's need and grows their grants in its share of the target's blocks; each grant
rides on the sequence's next round (HistoryDelta.reserve_tokens), where the target raises its
reserve. When the share runs short the most recently admitted request is preempted: both
workers free it (its releases ride on their next calls) and it is later sent whole. It decodes
what the target alone decodes (greedy) and what it draws alone (seeded), streamed once."""

from __future__ import annotations

import dataclasses

import pytest
from preemption_checks import (preempted_greedy_requests_decode_the_target_tokens,
                                preempted_seeded_requests_draw_what_they_draw_alone)

import worker_slots

from specdec.config.config import load_config
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.requests.request import DEFAULT_CAPS, GenerationRequest
from specdec.round.engine import SpeculativeEngine
from specdec.sampling.sampling_params import SamplingParams
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier

NUM_SLOTS, MAX_SEQ_LEN, BLOCK, POOL = 8, 64, 8, 16  # the target's pool holds two max_seq_len sequences
NEW_TOKENS = 32
GAMMA_LIMIT = 4  # a round writes at most 5 tokens: a request is admitted on its prompt + 5 + the watermark
CONFIG = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": MAX_SEQ_LEN, "block_size": BLOCK}})


@pytest.fixture(scope="module")
def workers():
    """A draft worker and a target worker whose pool holds POOL blocks of BLOCK tokens."""
    with worker_slots.paged_servers(CONFIG, POOL) as servers:
        yield servers


@pytest.fixture(scope="module")
def served(workers, tokenizer):
    """An engine over gRPC clients of both workers, γ at most GAMMA_LIMIT."""
    verifier = RemoteVerifier(workers["target"].address, 30.0)
    draft = RemoteProposer(workers["draft"].address, 30.0)
    engine = SpeculativeEngine(verifier, CompositeProposer({"draft": draft}, "draft"), 4,
                               eos_token_ids=[tokenizer.eos_token_id],
                               caps=dataclasses.replace(DEFAULT_CAPS, gamma_limit=GAMMA_LIMIT))
    yield engine
    verifier.close()
    draft.close()


def workers_hold_nothing(workers, engine) -> bool:
    """After the clients' buffered releases were sent: neither worker's cache holds a sequence."""
    engine.verifier.flush()
    engine.proposer.proposers["draft"].flush()
    target, draft = workers["target"].servicer.verifier, workers["draft"].servicer.proposer
    return target.runner.cache.num_live == 0 and draft.runner.cache.num_live == 0


def test_the_router_grows_grants_and_preempts_and_the_requests_decode_the_greedy_tokens(
        served, workers, prompt_ids, hf_greedy):
    """Four 8-token prompts are admitted on 4 blocks each (the whole share); each grows to 5."""
    assert served.verifier.grows_reserves and served.verifier.num_blocks == POOL
    preempted_greedy_requests_decode_the_target_tokens(served, [p[:8] for p in prompt_ids[:4]], hf_greedy, NEW_TOKENS,
                                                       lambda: workers_hold_nothing(workers, served))


def test_served_preempted_seeded_requests_draw_what_they_draw_alone(served, workers, prompt_ids):
    """Three 16-token prompts are admitted on 5 blocks each; each grows to 6."""
    preempted_seeded_requests_draw_what_they_draw_alone(served, [
        GenerationRequest(p[:16], NEW_TOKENS, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=i))
        for i, p in enumerate(prompt_ids[:3])])
    assert workers_hold_nothing(workers, served)
