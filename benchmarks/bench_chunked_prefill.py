"""Chunked prefill: do long prompts stall the streams already decoding? (issue 40 item 4)

Workload on the bundled pair: 4 greedy streams decode `--stream-tokens` tokens each (EOS
ignored) while one client sends prompts of 1,000-2,000 tokens back to back (the next when
the last finished; `--long-tokens` new tokens each). Measured on the 4 streams: ITL p99
(between a stream's successive outputs; a speculative round's tokens arrive together) and
their tokens/s, without the long-prompt client (A) and with it (B). Goal: B's ITL p99 ≤ 1.5×
and tokens/s ≥ 0.8× A's.

Trustworthy on a shared machine: each configuration runs A, B, A, B, ... (`--reps` pairs, one
warm engine, so A and B see the same load drift) and reports medians. Every time is taken
on two clocks: wall, and this process's CPU time (with `--threads 1`, what the work would
take on a dedicated core: other processes' load barely moves it). `--paths inprocess` steps
the engine directly; `served` runs the serving loop (`AsyncEngine`, as `specdec serve` does
in process) with asyncio clients. Usage:
    python benchmarks/bench_chunked_prefill.py [--chunks 0,256] [--slowdowns 0,0.15] [--reps 3]
        [--paths inprocess,served]
(256 and 0.15 are the config's defaults: pacing bounds only prompts longer than a chunk.)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import numpy as np
import torch

from specdec.config.config import SchedulingConfig, load_config
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest
from specdec.wiring.engine_builder import build_engine, build_served_engine

STREAMS = 4
LONG = (1000, 2000)  # the long prompts' lengths, tokens
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def long_prompt(rng: random.Random, corpus: list[int]) -> list[int]:
    """A prompt of 1,000-2,000 tokens cut from the bundled prompts repeated."""
    n = rng.randint(*LONG)
    start = rng.randrange(len(corpus))
    return [corpus[(start + i) % len(corpus)] for i in range(n)]


class Recorder:
    """The 4 streams' output times on both clocks, and what they emitted."""

    def __init__(self) -> None:
        self.times: dict[str, list[tuple[float, float]]] = {}
        self.lags: list[float] = []  # served: from the loop thread's step end to the consumer, s
        self.tokens = 0
        self.long_served = 0
        self.start = self.now()

    @staticmethod
    def now() -> tuple[float, float]:
        return CLOCKS["wall"](), CLOCKS["cpu"]()

    def output(self, stream: str, new_tokens: int) -> None:
        if new_tokens:
            self.times.setdefault(stream, []).append(self.now())
            self.tokens += new_tokens

    def summary(self) -> dict:
        """ITL p99 (ms) and tokens/s of the streams, per clock."""
        end, row = self.now(), {"long_prompts": self.long_served}
        for k, clock in enumerate(CLOCKS):
            gaps = [b[k] - a[k] for times in self.times.values() for a, b in zip(times, times[1:])]
            row[f"itl_p99_ms_{clock}"] = 1000 * float(np.percentile(gaps, 99))
            row[f"tokens_per_s_{clock}"] = self.tokens / (end[k] - self.start[k])
        if self.lags:
            row["handoff_ms"] = [1000 * float(np.percentile(self.lags, q)) for q in (50, 99)]
        return row


class StepEnds:
    """Served: when the loop thread's engine.step() returned each output that carries tokens
    (wall clock), so a consumer can tell how long the hand-off to asyncio took."""

    def __init__(self, engine) -> None:
        self.ends: dict[str, list[float]] = {}
        step = engine.step

        def stamped():
            outputs = step()
            now = CLOCKS["wall"]()
            for output in outputs:
                if output.new_token_ids:
                    self.ends.setdefault(output.seq_id, []).append(now)
            return outputs
        engine.step = stamped

    def lag(self, seq_id: str, k: int) -> float:
        """The k-th output's hand-off time (k counts the outputs with tokens)."""
        return CLOCKS["wall"]() - self.ends[seq_id][k]


def config(args: argparse.Namespace, chunk: int, slowdown: float):
    return load_config(overrides={
        "speculation": {"proposer": args.proposer, "gamma": args.gamma}, "load_monitor": {"enabled": False},
        "cache": {"num_slots": STREAMS + 2, "max_seq_len": 2048},
        "scheduling": {"prefill_chunk_tokens": chunk, "prefill_slowdown": slowdown},
    })


def run_inprocess(engine, prompts: list[list[int]], corpus: list[int], args, with_long: bool, seed: int) -> dict:
    """One run stepping the engine directly."""
    rng, rec = random.Random(seed), Recorder()
    streams = {engine.add_request(GenerationRequest(prompts[i], args.stream_tokens, ignore_eos=True))
               for i in range(STREAMS)}
    long_id, left = None, set(streams)
    while left:
        if with_long and long_id is None:
            long_id = engine.add_request(GenerationRequest(long_prompt(rng, corpus), args.long_tokens,
                                                           ignore_eos=True))
        for output in engine.step():
            if output.seq_id in streams:
                rec.output(output.seq_id, len(output.new_token_ids))
            if output.finish_reason is not None:
                engine.result(output.seq_id)
                left.discard(output.seq_id)
                if output.seq_id == long_id:
                    long_id, rec.long_served = None, rec.long_served + 1
    if long_id is not None:
        engine.abort(long_id)
        engine.result(long_id)
    return rec.summary()


async def _served_run(loop, prompts, corpus, args, with_long: bool, seed: int) -> dict:
    rng, rec, done = random.Random(seed), Recorder(), asyncio.Event()

    async def stream(i: int) -> None:
        k = 0
        async for output in loop.submit(GenerationRequest(prompts[i], args.stream_tokens, ignore_eos=True)):
            if output.new_token_ids:
                rec.lags.append(loop.step_ends.lag(output.seq_id, k))
                k += 1
            rec.output(str(i), len(output.new_token_ids))

    async def long_client() -> None:
        while not done.is_set():
            request = GenerationRequest(long_prompt(rng, corpus), args.long_tokens, ignore_eos=True)
            task = asyncio.ensure_future(loop.generate(request))
            await asyncio.wait([task, asyncio.ensure_future(done.wait())], return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
                rec.long_served += 1
            else:
                task.cancel()  # aborts the request
    client = asyncio.ensure_future(long_client()) if with_long else None
    await asyncio.gather(*(stream(i) for i in range(STREAMS)))
    summary = rec.summary()
    done.set()
    if client is not None:
        await client
    return summary


def run_served(served, prompts, corpus, args, with_long: bool, seed: int) -> dict:
    """One run through the serving loop (AsyncEngine's thread) with asyncio clients."""
    return asyncio.run(_served_run(served.loop, prompts, corpus, args, with_long, seed))


def pairs(path: str, args, chunk: int, slowdown: float) -> list[tuple[dict, dict]]:
    """A warm engine, then `reps` (without, with) pairs, alternating."""
    cfg = config(args, chunk, slowdown)
    if path == "served":
        served = build_served_engine(cfg)
        served.loop.step_ends = StepEnds(served.loop.engine)  # before the loop's first step
        target, encode, run = served, served.encode, run_served
    else:
        built = build_engine(cfg)
        target, encode, run = built.engine, built.encode, run_inprocess
    prompts = [encode(p) for p in bundled_prompts()]
    corpus = [t for p in prompts for t in p]
    try:
        run(target, prompts, corpus, args, True, seed=-1)  # warm-up (first-call costs, the policy's samples)
        return [(run(target, prompts, corpus, args, False, seed=rep),
                 run(target, prompts, corpus, args, True, seed=rep)) for rep in range(args.reps)]
    finally:
        if path == "served":
            served.close()


def report(path: str, chunk: int, slowdown: float, results: list[tuple[dict, dict]]) -> None:
    """One table row per clock: medians without and with the client, their ratio, and the
    range of the per-pair ratios (how noisy the figure is)."""
    name = "whole prompts" if chunk == 0 else \
        f"chunks of {chunk}" + (f", slowdown {slowdown:g}" if slowdown else ", unpaced")
    defaults = SchedulingConfig()
    if (chunk, slowdown) == (defaults.prefill_chunk_tokens, defaults.prefill_slowdown):
        name += " (defaults)"
    for clock in CLOCKS:
        cells = []
        for key in (f"itl_p99_ms_{clock}", f"tokens_per_s_{clock}"):
            a = statistics.median(r[0][key] for r in results)
            b = statistics.median(r[1][key] for r in results)
            each = sorted(r[1][key] / r[0][key] for r in results)
            cells.append(f"{a:.1f} | {b:.1f} | **{b / a:.2f}x** ({each[0]:.2f}-{each[-1]:.2f})")
        served = statistics.median(r[1]["long_prompts"] for r in results)
        print(f"| {path} | {name} | {clock} | {cells[0]} | {cells[1]} | {served:g} |", flush=True)
    if "handoff_ms" in results[0][1]:
        p50, p99 = (statistics.median(r[1]["handoff_ms"][k] for r in results) for k in (0, 1))
        print(f"(serving loop hand-off, loop thread's step end -> asyncio consumer, with the client: "
              f"median {p50:.2f} ms, p99 {p99:.2f} ms)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=lambda t: [int(x) for x in t.split(",")], default=[0, 256],
                    help="prefill_chunk_tokens values to compare (0 = whole prompts)")
    ap.add_argument("--slowdowns", type=lambda t: [float(x) for x in t.split(",")], default=[0.0, 0.15],
                    help="prefill_slowdown values of the chunked runs (0 = unpaced)")
    ap.add_argument("--paths", default="inprocess,served", help="inprocess and/or served (comma-separated)")
    ap.add_argument("--reps", type=int, default=3, help="(without, with) pairs per configuration")
    ap.add_argument("--stream-tokens", type=int, default=128, help="new tokens of each of the 4 streams")
    ap.add_argument("--long-tokens", type=int, default=8, help="new tokens of each long-prompt request")
    ap.add_argument("--proposer", default="draft", help="draft | ngram | none")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the CPU clock is a core's time)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"medians of {args.reps} A/B pairs; (range of the per-pair ratios); goal: ITL ratio <= 1.5x, "
          "tokens/s ratio >= 0.8x")
    print("| path | prefill | clock | ITL p99 without (ms) | with | ratio | tokens/s without | with | ratio | "
          "long prompts served |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in args.paths.split(","):
        for chunk, slowdown in configurations(args):
            report(path, chunk, slowdown, pairs(path, args, chunk, slowdown))


def configurations(args) -> list[tuple[int, float]]:
    """(prefill_chunk_tokens, prefill_slowdown) pairs: whole prompts once, chunks at each slowdown."""
    return [(chunk, slowdown) for chunk in args.chunks for slowdown in (args.slowdowns if chunk else [0.0])]


if __name__ == "__main__":
    main()
