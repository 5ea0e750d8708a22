"""Where drafting ahead loses its gain on the served path, at one stream (no Ray, no Serve).

Four engines on the same emulated pair, interleaved run by run, each looking ahead every
step or never (no measured choice, so that every step is the way named):

* in-process sequential / in-process look-ahead: the engine in this process (the target
  verifying on a thread of its own, `ConcurrentVerifier`, as in emulated_ahead.py);
* served sequential / served look-ahead: the router's engine (RemoteVerifier,
  RemoteProposer) against a DraftServicer and a TargetServicer, each behind its grpc.aio
  server in its own process, as in emulated_hops.py.

Per setup, per step (ms): the wall time, the verify call (sent to answered, as the round
thread got it), the look-ahead call, the proposals the step waited for before verifying,
the wait for the verdict after the look-ahead ended; the hit rate and tokens per step; and
the CPU time each process spent per step (router, draft worker, target worker), which shows
whether the draft worker's look-ahead takes the cores the target's verify needs.

Usage: python benchmarks/emulated_served_ahead.py [--profile h100-llama-8b-1b] [--runs 2]
    [--max-new-tokens 96] [--streams 1] [--setups served]   (--streams 8, 32: several requests together)
"""

from __future__ import annotations

import argparse
import json
import time

import psutil
import torch

from emulated_ahead import ConcurrentVerifier, decode_all
from emulated_core import emulated_engine
from emulated_hops import Worker, overrides
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest
from specdec.round.draft_ahead import DraftAhead
from specdec.round.overlap_choice import LOOK_AHEAD, SEQUENTIAL, OverlapChoice

SETUPS = ("in-process sequential", "in-process look-ahead", "served sequential", "served look-ahead",
          "served drafting ahead", "served drafting ahead, AsyncEngine", "served sequential through drafting ahead")
# the last two: the served default (each kind of step measuring its ways), stepped by the engine
# itself or, as the router replica does, by AsyncEngine with one request streamed after another;
# the last: DraftAhead in every round, every step sequential (what its machinery costs there)
BLOCKS: list = []  # (way, tokens, seconds, rounds) of every measured choice's block, in order


def _log_blocks() -> None:
    end_block = OverlapChoice._end_block

    def logged(choice: OverlapChoice) -> None:
        tokens, seconds = sum(t for t, _ in choice._block), sum(s for _, s in choice._block)
        BLOCKS.append((choice.way, tokens, round(seconds, 4), choice._rounds))
        end_block(choice)

    OverlapChoice._end_block = logged


class Spans(DraftAhead):
    """DraftAhead (looking ahead every step, or way None: measured), summing each step's
    look-ahead call and the wait for the verdict after it."""

    def __init__(self, way: str | None = LOOK_AHEAD) -> None:
        super().__init__(way=way)
        self.ahead_s = self.waited_s = 0.0

    def verdict_waited(self, ahead_s: float, waited_s: float) -> None:
        super().verdict_waited(ahead_s, waited_s)
        self.ahead_s += ahead_s
        self.waited_s += waited_s


def timed_verifier(verifier) -> list:
    """Sum the verify calls' time from sent to answered-and-parsed (verify and verify_async)."""
    spent = [0.0]
    if not verifier.runs_concurrently:  # verify_async calls verify
        verify = verifier.verify

        def timed_verify(requests):
            start = time.perf_counter()
            found = verify(requests)
            spent[0] += time.perf_counter() - start
            return found

        verifier.verify = timed_verify
        return spent
    verify_async = verifier.verify_async

    def timed(requests):
        pending, start = verify_async(requests), time.perf_counter()
        result = pending.result

        def answered():
            found = result()
            spent[0] += time.perf_counter() - start
            return found

        pending.result = answered
        return pending

    verifier.verify_async = timed
    verifier.verify = lambda requests: timed(requests).result()
    return spent


def served_engine(profile: str, workers: dict, slots: int, ahead: str | None):
    from specdec.config.config import load_config
    from specdec.wiring.engine_builder import build_engine
    from specdec_rpc.worker.remote_proposer import RemoteProposer
    from specdec_rpc.worker.remote_verifier import RemoteVerifier

    verifier, draft = RemoteVerifier(workers["target"].address), RemoteProposer(workers["draft"].address)
    config = overrides(profile, slots)
    config["speculation"]["overlap"] = True
    built = build_engine(load_config(overrides=config), verifier, draft)
    built.engine.draft_ahead = None if ahead is None else Spans(ahead or None)
    return built, (verifier, draft)


def local_engine(profile: str, slots: int, ahead: bool):
    built = emulated_engine(profile, 4, 1.0, slots)
    if ahead:
        built.engine.verifier = ConcurrentVerifier(built.engine.verifier)
        built.engine.draft_ahead = Spans()
    return built, ()


def streamed(built, prompts: list, max_new: int) -> tuple[int, float]:
    """The prompts one after another through AsyncEngine (mode on), as one client stream: (tokens, wall)."""
    import asyncio

    from specdec.serving.async_engine import AsyncEngine

    async def main() -> int:
        loop, tokens = AsyncEngine(built.engine, max_concurrent_requests=4), 0
        try:
            for prompt in prompts:
                async with loop.submit(GenerationRequest(prompt, max_new, mode="on")) as stream:
                    async for out in stream:
                        tokens += len(out.new_token_ids)
        finally:
            loop.shutdown()
        return tokens

    start = time.perf_counter()
    tokens = asyncio.run(main())
    return tokens, time.perf_counter() - start


def run(built, processes: dict, verify_s: list, prompts: list, streams: int, max_new: int,
        streaming: bool = False) -> dict:
    engine, ahead = built.engine, built.engine.draft_ahead
    profile = engine.timer.profile.to_dict()
    spans = (ahead.ahead_s, ahead.waited_s, ahead.rows_ahead, ahead.hits) if ahead else (0.0, 0.0, 0, 0)
    ways = dict(ahead.steps_by_way) if ahead else {}
    cpu = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
    verified = verify_s[0]
    blocks = len(BLOCKS)
    if streaming:
        tokens, wall = streamed(built, prompts, max_new)
    else:
        tokens, wall = decode_all(engine, prompts, streams, max_new)
    after = engine.timer.profile.to_dict()
    steps = after["rounds"] - profile["rounds"]
    per = 1000.0 / max(1, steps)
    waited = (after["propose_s"] - after["overlap_s"]) - (profile["propose_s"] - profile["overlap_s"])
    row = {"tokens_per_s": tokens / wall, "steps": steps, "tokens_per_step": tokens / max(1, steps),
           "step_ms": wall * per, "verify_ms": (verify_s[0] - verified) * per, "proposals_waited_ms": waited * per,
           **{f"cpu_{name}_ms": (sum(p.cpu_times()[:2]) - cpu[name]) * per for name, p in processes.items()}}
    if ahead:
        looked, hits = ahead.rows_ahead - spans[2], ahead.hits - spans[3]
        row.update(look_ahead_ms=(ahead.ahead_s - spans[0]) * per, verdict_wait_ms=(ahead.waited_s - spans[1]) * per,
                   hit_rate=hits / looked if looked else None,
                   look_ahead_steps=(ahead.steps_by_way.get(LOOK_AHEAD, 0) - ways.get(LOOK_AHEAD, 0)) / max(1, steps))
        if ahead.lone_choice is not None and ahead.way is None:
            row["rates"] = dict(ahead.lone_choice.rates)
            row["blocks"] = BLOCKS[blocks:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="h100-llama-8b-1b")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    parser.add_argument("--setups", default="", help="comma-separated parts of the setups' names to run (all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    _log_blocks()
    slots = args.streams * 12 + 8
    workers = {role: Worker(role, args.profile, slots) for role in ("draft", "target")}
    me = psutil.Process()
    served = {"router": me, **{role: psutil.Process(w.proc.pid) for role, w in workers.items()}}
    engines, clients = {}, []
    for setup in [s for s in SETUPS if any(part in s for part in args.setups.split(","))]:
        ahead = setup.endswith("look-ahead")
        way = SEQUENTIAL if "through" in setup else LOOK_AHEAD if ahead else \
            None if setup.endswith("sequential") else ""
        built, owned = (served_engine(args.profile, workers, slots, way)
                        if setup.startswith("served") else local_engine(args.profile, slots, ahead))
        clients.extend(owned)
        engines[setup] = (built, timed_verifier(built.engine.verifier))
    prompts = [next(iter(engines.values()))[0].encode(p) for p in bundled_prompts()[:4]]
    rows = []
    try:
        for setup, (built, spent) in engines.items():  # warm-up
            run(built, {}, spent, prompts, args.streams, args.max_new_tokens // 2, setup.endswith("AsyncEngine"))
        for number in range(1, args.runs + 1):
            for setup, (built, spent) in engines.items():
                processes = served if setup.startswith("served") else {"router": me}
                row = {"setup": setup, "run": number, **run(built, processes, spent, prompts, args.streams,
                                                             args.max_new_tokens, setup.endswith("AsyncEngine"))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for client in clients:
            client.close()
        for w in workers.values():
            w.close()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def table(rows: list[dict]) -> str:
    cols = ("tokens_per_s", "step_ms", "tokens_per_step", "verify_ms", "proposals_waited_ms", "look_ahead_ms",
            "verdict_wait_ms", "hit_rate", "look_ahead_steps", "cpu_router_ms", "cpu_draft_ms", "cpu_target_ms")
    lines = ["| setup | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for setup in SETUPS:
        found = [r for r in rows if r["setup"] == setup]
        cells = []
        for col in cols:
            values = [r[col] for r in found if r.get(col) is not None]
            cells.append(", ".join(f"{v:.2f}" for v in values) if values else "–")
        lines.append(f"| {setup} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
