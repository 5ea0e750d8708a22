"""Checks shared by the in-process and the served preemption tests: requests admitted on their
next round's need, preempted when the blocks run out, decode what they decode alone (greedy:
the target's own tokens; seeded: their unpreempted draws) and stream each token once."""

from __future__ import annotations

from collections.abc import Callable

from specdec.requests.request import GenerationRequest


def run_streams(engine, requests: list[GenerationRequest]) -> tuple[list, list, int]:
    """Submit all, step to the end: (results, each request's streamed tokens, most running at once)."""
    ids = [engine.add_request(r) for r in requests]
    streamed, most = {seq_id: [] for seq_id in ids}, 0
    while engine.has_unfinished():
        for output in engine.step():
            streamed[output.seq_id] += output.new_token_ids
        most = max(most, engine.num_running)
    return [engine.result(seq_id) for seq_id in ids], [streamed[seq_id] for seq_id in ids], most


def preempted_greedy_requests_decode_the_target_tokens(engine, prompts: list[list[int]], hf_greedy, new_tokens: int,
                                                       hold_nothing: Callable[[], bool]) -> list:
    """All of `prompts` run at once, at least one is preempted, each decodes transformers' greedy
    tokens, streamed once, the draft drafted for them, and both models end holding nothing
    (`hold_nothing`). Returns the results."""
    before = engine.preemptions
    results, streamed, most = run_streams(engine, [GenerationRequest(p, new_tokens, ignore_eos=True) for p in prompts])
    assert most == len(prompts), "all ran at once, each admitted on its prompt and a round"
    assert engine.preemptions > before
    assert [r.token_ids for r in results] == [hf_greedy(p, new_tokens) for p in prompts]
    assert streamed == [r.token_ids for r in results], "no token repeated or lost across a preemption"
    assert sum(r.stats.accepted for r in results) > 0, "the draft drafted for them"
    assert hold_nothing(), "both models freed every preempted and finished request"
    return results


def preempted_seeded_requests_draw_what_they_draw_alone(engine, requests: list[GenerationRequest]) -> None:
    """Run together, some are preempted; run alone, none is; each draws the same tokens."""
    before = engine.preemptions
    together = [r.token_ids for r in run_streams(engine, requests)[0]]
    assert engine.preemptions > before
    between = engine.preemptions
    alone = [engine.generate([r])[0].token_ids for r in requests]
    assert engine.preemptions == between, "alone, each fits the pool"
    assert together == alone
