"""Preemption, in-process: requests are admitted on their next round's need, so more run at once
than their full reserves allow; when the blocks run out the most recently admitted one is sent
back to the queue (both models free its blocks) and later reads its history again. A preempted
request decodes exactly what it decodes alone (greedy and seeded), its stream sees every token
once, and a request the pool cannot hold alone is refused at entry."""

from __future__ import annotations

import pytest
from admission_checks import budget_of_blocks
from preemption_checks import (preempted_greedy_requests_decode_the_target_tokens,
                                preempted_seeded_requests_draw_what_they_draw_alone)

from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

MAX_SEQ_LEN, BLOCK, POOL = 64, 8, 16  # the pool holds two max_seq_len sequences
GAMMA_LIMIT = 4  # a round writes at most 5 tokens: a request is admitted on its prompt + 5 + the watermark
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def small_pool(make_engine):
    """A draft-speculating engine whose pools (target and draft) hold 16 blocks of 8 tokens."""
    built = make_engine("draft", 4, speculation={"proposer": "draft", "gamma": 4, "gamma_limit": GAMMA_LIMIT},
                        load_monitor={"enabled": False, "gamma_max": GAMMA_LIMIT},
                        cache={"num_slots": 8, "max_seq_len": MAX_SEQ_LEN, "block_size": BLOCK,
                               "memory_budget": budget_of_blocks(make_engine, POOL, BLOCK)})
    assert built.engine.verifier.runner.cache.num_blocks == POOL
    return built.engine


def caches_hold_nothing(engine) -> bool:
    draft = engine.proposer.proposers["draft"].runner
    return engine.verifier.runner.cache.num_live == 0 and draft.cache.num_live == 0


@pytest.mark.slow
def test_preempted_requests_decode_the_greedy_tokens_and_stream_each_once(small_pool, prompt_ids, hf_greedy):
    """Four 8-token prompts are admitted on 4 blocks each (the whole pool); each grows to 5."""
    prompts = [p[:8] for p in prompt_ids[:4]]
    results = preempted_greedy_requests_decode_the_target_tokens(small_pool, prompts, hf_greedy, NEW_TOKENS,
                                                                 lambda: caches_hold_nothing(small_pool))
    assert len({tuple(p) for p in prompts}) == 4 and all(r.stats.cached_tokens == 0 for r in results), \
        "a resumed request's re-read of its own blocks is not a prefix-cache hit"


@pytest.mark.slow
def test_preempted_seeded_requests_draw_what_they_draw_alone(small_pool, prompt_ids):
    """Three 16-token prompts are admitted on 5 blocks each; each grows to 6."""
    preempted_seeded_requests_draw_what_they_draw_alone(small_pool, [
        GenerationRequest(p[:16], NEW_TOKENS, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=i))
        for i, p in enumerate(prompt_ids[:3])])


def test_a_request_the_pool_cannot_hold_alone_is_refused_at_entry(small_pool, prompt_ids):
    with pytest.raises(ValueError, match=f"exceed the context of {MAX_SEQ_LEN} tokens"):
        small_pool.add_request(GenerationRequest(prompt_ids[0][:16], MAX_SEQ_LEN))
    assert not small_pool.has_unfinished()
