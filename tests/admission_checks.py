"""A check shared by the in-process and the served admission tests: short requests admitted by
the cache blocks they reserve all run at once and decode what the target alone decodes."""

from __future__ import annotations

from specdec.requests.request import GenerationRequest


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
