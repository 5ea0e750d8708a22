"""A check shared by the in-process and the served admission tests: short requests admitted by
the cache blocks they reserve all run at once and decode what the target alone decodes."""

from __future__ import annotations

from specdec.models.kv_cache import KVCache
from specdec.requests.request import GenerationRequest


def budget_of_blocks(make_engine, blocks: int, block_size: int) -> float:
    """cache.memory_budget (bytes) of exactly ``blocks`` blocks of the bundled target's K/V."""
    model = make_engine("none", 0, cache={"num_slots": 1, "max_seq_len": 64}).engine.verifier.runner.model
    return float(blocks * KVCache.block_bytes(model.config.num_hidden_layers, block_size, model.num_local_kv_heads,
                                              model.config.head_dim, model.dtype))


def short_requests_run_at_once(engine, prompts: list[list[int]], hf_greedy, max_new_tokens: int = 12) -> None:
    """All of `prompts` run from the first step on (none waits), with transformers' greedy tokens,
    and the draft drafted for them (its cache admitted them too)."""
    ids = [engine.add_request(GenerationRequest(p, max_new_tokens, ignore_eos=True)) for p in prompts]
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (len(prompts), 0)
    while engine.has_unfinished():
        engine.step()
    results = [engine.result(i) for i in ids]
    assert [r.token_ids for r in results] == [hf_greedy(p, max_new_tokens) for p in prompts]
    assert sum(r.stats.accepted for r in results) > 0, "the draft admitted them too"
