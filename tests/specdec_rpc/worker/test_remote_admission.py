"""Served admission by reserve and cached prompt tokens over gRPC (real grpc.aio workers on
127.0.0.1, no Ray): the router sends each sequence's grant (its next round's need, grown as it
decodes; at most prompt + max_new_tokens) with its history, the workers reserve that many cache
blocks (not max_seq_len), and the router admits by its share of the target's blocks
(WorkerInfo.num_blocks / block_size); a request its share can never hold is refused at entry.
Cached prompt tokens come back in each outcome and reach the public stats."""

from __future__ import annotations

import pytest
from admission_checks import short_requests_run_at_once

import worker_slots

from specdec.config.config import load_config
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.requests.request import GenerationRequest
from specdec.round.engine import SpeculativeEngine
from specdec_rpc.public.public_api import to_stats
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier

NUM_SLOTS, MAX_SEQ_LEN, BLOCK = 8, 256, 16
NUM_BLOCKS = 2 * MAX_SEQ_LEN // BLOCK  # the blocks of two max_seq_len sequences
CONFIG = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": MAX_SEQ_LEN}})


@pytest.fixture(scope="module")
def workers():
    """A draft worker (a full cache) and a target worker with 8 slots but NUM_BLOCKS blocks."""
    with worker_slots.paged_servers(CONFIG, NUM_BLOCKS) as servers:
        yield servers


@pytest.fixture
def engine(workers, tokenizer):
    """make(slot_budget) -> an engine over gRPC clients of both workers."""
    clients = []

    def make(slot_budget: int | None = None) -> SpeculativeEngine:
        verifier = RemoteVerifier(workers["target"].address, 30.0, slot_budget=slot_budget)
        draft = RemoteProposer(workers["draft"].address, 30.0)
        clients.extend([verifier, draft])
        return SpeculativeEngine(verifier, CompositeProposer({"draft": draft}, "draft"), 4,
                                 eos_token_ids=[tokenizer.eos_token_id])

    yield make
    for client in clients:
        client.close()


def test_the_target_worker_reports_its_blocks_and_the_router_admits_by_them(engine, workers, prompt_ids, hf_greedy):
    info = workers["target"].servicer.info()
    assert (info.num_blocks, info.block_size, info.num_slots) == (NUM_BLOCKS, BLOCK, NUM_SLOTS)
    short_requests_run_at_once(engine(), [p[:20] for p in prompt_ids[:6]], hf_greedy)  # 2 slots by max_seq_len


def test_long_prompts_wait_for_the_blocks_of_finished_requests(engine, prompt_ids):
    """Admitted on its prompt and a round (the router grows grants), a 200-token prompt takes 15
    of the share's 32 blocks: two fill it."""
    remote = engine()
    prompts = [(p * 4)[:200] for p in prompt_ids[:3]]
    ids = [remote.add_request(GenerationRequest(p, MAX_SEQ_LEN - len(p))) for p in prompts]
    remote.step()
    assert remote.verifier.grows_reserves
    assert (remote.num_running, remote.num_waiting) == (2, 1), "two long prompts' grants fill the target"
    remote.abort(ids[0])
    remote.step()
    assert (remote.num_running, remote.num_waiting) == (2, 0), "the freed blocks admit the third"
    for seq_id in ids[1:]:
        remote.abort(seq_id)


def test_a_request_the_routers_share_can_never_hold_is_refused_at_entry(engine, prompt_ids):
    remote = engine(slot_budget=2)  # a quarter of the slots: a quarter of the blocks, 128 tokens
    assert remote.verifier.max_seq_len == NUM_BLOCKS * BLOCK * 2 // NUM_SLOTS
    prompt = prompt_ids[0][:20]
    with pytest.raises(ValueError, match="context of 128 tokens"):
        remote.add_request(GenerationRequest(prompt, 128 - len(prompt) + 1))
    remote.add_request(GenerationRequest(prompt, 128 - len(prompt)))


def test_cached_prompt_tokens_come_back_from_the_target_worker(engine, prompt_ids):
    remote = engine()
    prompt = [5, 6, 7, 8] + [t for p in prompt_ids for t in p][:66]  # a start no earlier test sent
    first, second = (remote.generate([GenerationRequest(prompt, 8)])[0] for _ in range(2))
    assert first.stats.cached_tokens == 0 and second.token_ids == first.token_ids
    assert 0 < second.stats.cached_tokens < len(prompt) and second.stats.cached_tokens % BLOCK == 0
    assert to_stats(second.stats).cached_tokens == second.stats.cached_tokens


def test_the_router_grows_grants_in_its_share_without_a_call():
    """Bookkeeping only (no channel): held sequences grow in order while the share's blocks not
    reserved cover them, after the reserves of sequences not sent yet; a sequence not held yet
    counts as new on its whole grant; a grant never shrinks."""
    remote = RemoteVerifier.__new__(RemoteVerifier)  # no target: grow never calls one
    remote.num_slots, remote.num_blocks, remote.block_size, remote._held = 8, 10, 16, {"a": 2, "b": 3}
    assert remote.grows_reserves
    assert remote.grow([("a", 64), ("b", 40)], taken=[32]) == 2  # a: +2 blocks, b: 3 already
    assert remote._held == {"a": 4, "b": 3} and remote.admits([16]) == 1
    assert remote.grow([("a", 20), ("b", 64), ("new", 48)], taken=[]) == 2, "b: +1 of 3; new needs 3 of 2"
    assert remote._held == {"a": 4, "b": 4}
    assert remote.grow([("a", 80)], taken=[16, 16]) == 0, "2 blocks left, both taken by sequences not sent yet"
