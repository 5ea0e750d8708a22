"""Preemption, served (real grpc.aio workers on 127.0.0.1, no Ray): the router admits requests on
their next round's need and grows their grants in its share of the target's blocks; each grant
rides on the sequence's next round (HistoryDelta.reserve_tokens), where the target raises its
reserve. When the share runs short the most recently admitted request is preempted: both
workers free it (its releases ride on their next calls) and it is later sent whole. It decodes
what the target alone decodes (greedy) and what it draws alone (seeded), streamed once."""

from __future__ import annotations

import dataclasses

import pytest
from admission_checks import run_streams

from specdec.config.config import load_config
from specdec.models.loader import load_model
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.requests.request import DEFAULT_CAPS, GenerationRequest
from specdec.round.engine import SpeculativeEngine
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.target_verifier import TargetVerifier
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.target_servicer import TargetServicer
from specdec_rpc.worker.worker_server import ServerThread

NUM_SLOTS, MAX_SEQ_LEN, BLOCK, POOL = 8, 64, 8, 16  # the target's pool holds two max_seq_len sequences
NEW_TOKENS = 32
GAMMA_LIMIT = 4  # a round writes at most 5 tokens: a request is admitted on its prompt + 5 + the watermark
CONFIG = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": MAX_SEQ_LEN, "block_size": BLOCK}})


@pytest.fixture(scope="module")
def workers():
    """A draft worker and a target worker whose pool holds POOL blocks of BLOCK tokens."""
    target = ModelRunner(load_model(resolve_model_path(CONFIG.models.target)), NUM_SLOTS, MAX_SEQ_LEN,
                         block_size=BLOCK, num_blocks=POOL)
    servers = {"draft": ServerThread(DraftServicer.from_config(CONFIG)),
               "target": ServerThread(TargetServicer(TargetVerifier(target), CONFIG.models.target, NUM_SLOTS))}
    yield servers
    for server in servers.values():
        server.stop()


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
    prompts = [p[:8] for p in prompt_ids[:4]]
    assert served.verifier.grows_reserves and served.verifier.num_blocks == POOL
    before = served.preemptions
    results, streamed, most = run_streams(served, [GenerationRequest(p, NEW_TOKENS, ignore_eos=True) for p in prompts])
    assert most == 4, "all four ran at once, each admitted on its prompt and a round"
    assert served.preemptions > before
    assert [r.token_ids for r in results] == [hf_greedy(p, NEW_TOKENS) for p in prompts]
    assert streamed == [r.token_ids for r in results], "no token repeated or lost across a preemption"
    assert sum(r.stats.accepted for r in results) > 0, "the draft worker drafted for them"
    assert workers_hold_nothing(workers, served), "both workers freed every preempted and finished request"


def test_served_preempted_seeded_requests_draw_what_they_draw_alone(served, workers, prompt_ids):
    """Three 16-token prompts are admitted on 5 blocks each; each grows to 6."""
    requests = [GenerationRequest(p[:16], NEW_TOKENS, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=i))
                for i, p in enumerate(prompt_ids[:3])]
    before = served.preemptions
    together = [r.token_ids for r in run_streams(served, requests)[0]]
    assert served.preemptions > before
    between = served.preemptions
    alone = [served.generate([r])[0].token_ids for r in requests]
    assert served.preemptions == between, "alone, each fits the share"
    assert together == alone
    assert workers_hold_nothing(workers, served)
