"""Paged KV cache benchmark: the three ratios of issue 40 on the bundled target (prints Markdown).

1. Concurrency at one memory budget: the slot cache holds ``--slots`` sequences of
   ``max_seq_len`` (room for the longest request); the paged cache, with the same bytes, admits
   each request with a reserve of its prompt + max_new_tokens blocks (`KVCache.allocate`'s
   ``reserve_tokens``), so no admitted sequence can run out of blocks. Block bookkeeping only (no
   forwards): the count is exact for the rule, whatever the model. Prompts 16-2,000 tokens, drawn
   uniformly and log-uniformly (many short, few long), seeded.
2. TTFT of a prompt whose first 512 tokens are cached (another request sent them) vs the same
   prompt uncached: one prefill forward each (``last_only``), median of ``--repeats``.
3. Single-stream decode tokens/s with 16-token blocks vs one block per sequence (the slot
   cache's layout: every sequence contiguous), best of ``--repeats``.

Usage: python benchmarks/bench_memory.py [--repeats 3] [--decode-tokens 200]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

import torch

from specdec.models.model_paths import resolve_model_path
from specdec.models.kv_cache import CacheFullError, KVCache
from specdec.models.model_runner import ModelRunner

MAX_NEW_TOKENS = 128
MAX_PROMPT = 2000


def prompt_lengths(count: int, log_uniform: bool, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    if log_uniform:
        return [int(math.exp(rng.uniform(math.log(16), math.log(MAX_PROMPT)))) for _ in range(count)]
    return [rng.randint(16, MAX_PROMPT) for _ in range(count)]


def concurrent_sequences(slots: int, block_size: int, lengths: list[int]) -> tuple[int, int]:
    """(slot cache, paged cache) sequences admitted at once, in arrival order, at the slot cache's memory."""
    max_seq_len = MAX_PROMPT + MAX_NEW_TOKENS
    blocks = slots * -(-max_seq_len // block_size)  # the slot cache's bytes, in blocks
    cache = KVCache(num_layers=1, num_slots=len(lengths), max_seq_len=max_seq_len, num_kv_heads=1, head_dim=1,
                    block_size=block_size, num_blocks=blocks)
    admitted = 0
    for length in lengths:
        try:
            cache.allocate(reserve_tokens=length + MAX_NEW_TOKENS)
        except CacheFullError:
            break
        admitted += 1
    return min(slots, len(lengths)), admitted


def ttft_ratio(runner: ModelRunner, repeats: int, prefix_len: int = 512, suffix_len: int = 32) -> tuple[float, float]:
    """(uncached, cached) median prefill seconds of a prefix_len + suffix_len prompt."""
    rng = random.Random(1)
    uncached, cached = [], []
    for _ in range(repeats):
        prefix = [rng.randrange(1, runner.vocab_size) for _ in range(prefix_len)]
        for times in (uncached, cached):  # the first request fills the prefix cache for the second
            slot = runner.allocate_slot()
            suffix = [rng.randrange(1, runner.vocab_size) for _ in range(suffix_len)]
            start = time.perf_counter()
            runner.forward([slot], [prefix + suffix], last_only=True)
            times.append(time.perf_counter() - start)
            runner.free_slot(slot)
    return statistics.median(uncached), statistics.median(cached)


def decode_tokens_per_s(runners: list[ModelRunner], tokens: int, repeats: int) -> list[float]:
    """Best tokens/s of each runner; the runners take turns so background load hits them alike."""
    best = [0.0] * len(runners)
    for _ in range(repeats):
        for i, runner in enumerate(runners):
            slot = runner.allocate_slot()
            runner.forward([slot], [list(range(1, 65))], last_only=True)
            start = time.perf_counter()
            for step in range(tokens):
                runner.forward([slot], [[5 + step % 50]], last_only=True)
            best[i] = max(best[i], tokens / (time.perf_counter() - start))
            runner.free_slot(slot)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=200)
    parser.add_argument("--slots", type=int, default=16, help="the slot cache's num_slots (config default)")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| measure | slot cache | paged | ratio |\n|---|---|---|---|")
    for name, log_uniform in (("uniform", False), ("log-uniform", True)):
        slot, paged = concurrent_sequences(args.slots, args.block_size, prompt_lengths(500, log_uniform))
        print(f"| concurrent sequences, prompts 16-2,000 {name} | {slot} | {paged} | {paged / slot:.2f}x |")
    path = resolve_model_path("bundled:target")
    runner = ModelRunner.from_pretrained(path, num_slots=2, max_seq_len=1024, block_size=args.block_size)
    uncached, cached = ttft_ratio(runner, args.repeats)
    print(f"| TTFT, 512-token prefix (uncached / cached), ms | {uncached * 1e3:.1f} | {cached * 1e3:.1f} "
          f"| {cached / uncached:.2f}x |")
    contiguous = ModelRunner.from_pretrained(path, num_slots=2, max_seq_len=1024, block_size=1024)
    slot_tps, paged_tps = decode_tokens_per_s([contiguous, runner], args.decode_tokens, args.repeats)
    print(f"| single-stream decode tokens/s (one block per sequence / {args.block_size}-token blocks) "
          f"| {slot_tps:.1f} | {paged_tps:.1f} | {paged_tps / slot_tps:.2f}x |")


if __name__ == "__main__":
    main()
