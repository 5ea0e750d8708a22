"""Chunked prefill: do long prompts stall the streams already decoding? (issue 40 item 4)

Workload, in-process on the bundled pair: 4 greedy streams decode `--stream-tokens` tokens
each (EOS ignored) while one client sends prompts of 1,000-2,000 tokens back to back (the
next when the last finished; `--long-tokens` new tokens each). Measured on the 4 streams:
ITL p99 (seconds between a stream's successive outputs; a speculative round's tokens
arrive together) and their tokens/s, with the long-prompt client and without it, with
chunked prefill off (prefill_chunk_tokens 0) and on (`--chunks`). Goal: with the client,
ITL p99 ≤ 1.5× and tokens/s ≥ 0.8× of without it. Usage:
    python benchmarks/bench_chunked_prefill.py [--chunks 32,256] [--stream-tokens 128] [--proposer draft]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_engine
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest

STREAMS = 4
LONG = (1000, 2000)  # the long prompts' lengths, tokens


def long_prompt(rng: random.Random, corpus: list[int]) -> list[int]:
    """A prompt of 1,000-2,000 tokens cut from the bundled prompts repeated."""
    n = rng.randint(*LONG)
    start = rng.randrange(len(corpus))
    return [corpus[(start + i) % len(corpus)] for i in range(n)]


def run(args: argparse.Namespace, chunk: int, with_long: bool) -> dict:
    """One run: the 4 streams' ITL p99 and tokens/s (and the long prompts served)."""
    built = build_engine(load_config(overrides={
        "speculation": {"proposer": args.proposer, "gamma": args.gamma}, "load_monitor": {"enabled": False},
        "cache": {"num_slots": STREAMS + 2, "max_seq_len": 2048}, "scheduling": {"prefill_chunk_tokens": chunk},
    }))
    engine, rng = built.engine, random.Random(0)
    prompts = [built.encode(p) for p in bundled_prompts()]
    corpus = [t for p in prompts for t in p]
    streams = {engine.add_request(GenerationRequest(prompts[i], args.stream_tokens, ignore_eos=True)): []
               for i in range(STREAMS)}
    long_id, served, tokens, left = None, 0, 0, set(streams)
    start = time.perf_counter()
    while left:
        if with_long and long_id is None:
            long_id = engine.add_request(GenerationRequest(long_prompt(rng, corpus), args.long_tokens,
                                                           ignore_eos=True))
        for output in engine.step():
            if output.seq_id in streams and output.new_token_ids:
                streams[output.seq_id].append(time.perf_counter())
                tokens += len(output.new_token_ids)
            if output.finish_reason is not None:
                engine.result(output.seq_id)
                left.discard(output.seq_id)
                if output.seq_id == long_id:
                    long_id, served = None, served + 1
    elapsed = time.perf_counter() - start
    gaps = [b - a for times in streams.values() for a, b in zip(times, times[1:])]
    return {"itl_p99_ms": 1000 * float(np.percentile(gaps, 99)), "tokens_per_s": tokens / elapsed,
            "long_prompts": served}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=lambda t: [int(x) for x in t.split(",")], default=[256],
                    help="prefill_chunk_tokens of the chunked rows (comma-separated)")
    ap.add_argument("--stream-tokens", type=int, default=128, help="new tokens of each of the 4 streams")
    ap.add_argument("--long-tokens", type=int, default=8, help="new tokens of each long-prompt request")
    ap.add_argument("--proposer", default="draft", help="draft | ngram | none")
    ap.add_argument("--gamma", type=int, default=4)
    args = ap.parse_args()
    print("| prefill | long-prompt client | ITL p99 (ms) | tokens/s (4 streams) | long prompts served | "
          "ITL p99 / without | tokens/s / without |")
    print("|---|---|---|---|---|---|---|")
    for chunk in (0, *args.chunks):
        base = run(args, chunk, with_long=False)
        for with_long, row in ((False, base), (True, run(args, chunk, with_long=True))):
            name = "whole prompts" if chunk == 0 else f"chunks of {chunk}"
            print(f"| {name} | {'yes' if with_long else 'no'} | {row['itl_p99_ms']:.1f} | {row['tokens_per_s']:.0f} | "
                  f"{row['long_prompts']} | {row['itl_p99_ms'] / base['itl_p99_ms']:.2f}x | "
                  f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
