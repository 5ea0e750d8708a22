"""Admission by reserve and cached prompt tokens, in-process: a request reserves cache blocks for
its prompt and its next round (growing as it decodes, never max_seq_len up front), so a memory
budget smaller than num_slots x max_seq_len runs more requests at once, with the same tokens; a prompt whose leading
blocks another request computed reports them as cached, and decodes the same tokens."""

from __future__ import annotations

import pytest
from admission_checks import budget_of_blocks, short_requests_run_at_once

from specdec.requests.request import GenerationRequest

MAX_SEQ_LEN, BLOCK = 256, 16
SEQUENCES_OF_MAX_LEN = 2  # the memory budget: room for two sequences of max_seq_len


@pytest.fixture(scope="module")
def small_budget(make_engine):
    """A draft-speculating engine with 8 slots but the blocks of 2 max_seq_len sequences."""
    budget = budget_of_blocks(make_engine, SEQUENCES_OF_MAX_LEN * MAX_SEQ_LEN // BLOCK, BLOCK)
    built = make_engine("draft", 4, cache={"num_slots": 8, "max_seq_len": MAX_SEQ_LEN, "block_size": BLOCK,
                                           "memory_budget": budget})
    assert built.engine.verifier.runner.cache.num_blocks == SEQUENCES_OF_MAX_LEN * MAX_SEQ_LEN // BLOCK
    return built


def test_short_requests_are_admitted_by_the_blocks_they_reserve(small_budget, prompt_ids, hf_greedy):
    """6 requests of 2 blocks each fit the 32 blocks at once; counted in max_seq_len slots, 2 would."""
    short_requests_run_at_once(small_budget.engine, [p[:20] for p in prompt_ids[:6]], hf_greedy)


def test_requests_asking_up_to_max_seq_len_are_admitted_on_their_next_rounds_need(small_budget, prompt_ids):
    """Their full reserves (max_seq_len each) would admit 2; each is admitted on its prompt and
    one round, so all 4 run (their grants grow as they decode)."""
    engine = small_budget.engine
    ids = [engine.add_request(GenerationRequest(p, MAX_SEQ_LEN - len(p))) for p in prompt_ids[:4]]
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (4, 0)
    for seq_id in ids:
        engine.abort(seq_id)
    assert engine.verifier.runner.cache.admits([MAX_SEQ_LEN] * 2) == 2, "aborting freed their blocks"


def test_a_short_request_passes_a_long_one_that_waits_for_blocks_with_the_same_tokens(small_budget, prompt_ids,
                                                                                      hf_greedy):
    """Two 200-token prompts fill the blocks (28 of 32 for their prompts and 20 new tokens); a
    third waits, and a short request behind it that fits the blocks left starts first, decoding
    what the target alone decodes."""
    engine = small_budget.engine
    text = [t for p in prompt_ids for t in p]
    long_ids = [engine.add_request(GenerationRequest(text[i * 10: i * 10 + 200], 20)) for i in range(3)]
    short = prompt_ids[3][:20]
    short_id = engine.add_request(GenerationRequest(short, 8, ignore_eos=True))
    engine.step()
    assert engine.num_waiting == 1 and short_id in engine.running_ids()
    for seq_id in long_ids:
        if seq_id not in engine.running_ids():
            engine.abort(seq_id)
    while short_id in engine.running_ids():
        engine.step()
    assert engine.result(short_id).token_ids == hf_greedy(short, 8)
    for seq_id in engine.running_ids():
        engine.abort(seq_id)


def test_a_repeated_long_prefix_reports_cached_prompt_tokens_and_the_same_tokens(make_engine, prompt_ids):
    engine = make_engine("draft", 4).engine
    prompt = [t for p in prompt_ids for t in p][:70]
    first, second = (engine.generate([GenerationRequest(prompt, 16)])[0] for _ in range(2))
    assert first.stats.cached_tokens == 0
    assert 0 < second.stats.cached_tokens < len(prompt) and second.stats.cached_tokens % BLOCK == 0
    assert second.token_ids == first.token_ids
