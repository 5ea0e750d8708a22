"""Paged KV cache benchmark: the ratios of issue 40 on the bundled pair at the default config (prints Markdown).

1. Concurrency at the default memory budget: the engine built from the default config (no
   overrides: `cache.memory_budget` null, `cache.num_slots` its cap, `cache.max_seq_len` the
   model's context) serves ``--requests`` greedy requests at once, prompts of 16-2,000 tokens
   drawn uniformly and log-uniformly (many short, few long), seeded, each asking for up to
   ``--max-new-tokens`` (fewer where the prompt leaves less of the context). Counted each round:
   the sequences running on the target (admitted on their prompt and next round, their grants
   growing as they decode, `CacheGrants`) and those the draft's cache holds (both models have a
   pool of the same budget); reported are the most at once and the mean over the rounds in which
   requests still waited for blocks, the failed requests (must be 0) and the preemptions; and,
   from block bookkeeping alone, how many a full queue's first admission takes on the engine's
   admission reserves (`CacheGrants.admission`: a long prompt on its first chunk; mean of 20
   seeded draws: one draw varies with its first long prompts). The slot cache at the same
   memory holds pool tokens / max_seq_len sequences: it must size every slot for the longest
   request the context allows.
2. TTFT of a prompt whose first 512 tokens are cached (another request sent them) vs the same
   prompt uncached: one prefill forward each (``last_only``), median of ``--repeats``.
3. Single-stream decode tokens/s with the default blocks vs one block per sequence (the slot
   cache's layout: every sequence contiguous), best of ``--repeats``, taking turns.

Each workload runs on each of ``--paths`` in turn: ``in-process`` (the engine over the models) and
``served`` (the router's engine over gRPC clients of a target and a draft worker, as `specdec
serve` runs them, the workers on threads of this process: the router grows grants in its share of
the target's blocks and preempts through both workers); ``served-full-reserves`` is served with
the router admitting on full reserves (prompt + max_new_tokens), as before it grew grants.

Usage: python benchmarks/bench_memory.py [--requests 200] [--max-new-tokens 128] [--repeats 3]
       [--paths in-process,served,served-full-reserves] [--concurrency-only]
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import time

import torch

from specdec.config.config import load_config
from specdec.models.kv_cache import KVCache
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.requests.request import GenerationRequest
from specdec.requests.sequence import Sequence
from specdec.requests.stop_conditions import StopChecker
from specdec.round.cache_grants import CacheGrants
from specdec.wiring.engine_builder import build_engine

MIN_PROMPT, MAX_PROMPT = 16, 2000
LONG_PROMPT = 1000  # the prompts whose TTFT is reported


def prompt_lengths(count: int, log_uniform: bool, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    if log_uniform:
        return [int(math.exp(rng.uniform(math.log(MIN_PROMPT), math.log(MAX_PROMPT)))) for _ in range(count)]
    return [rng.randint(MIN_PROMPT, MAX_PROMPT) for _ in range(count)]


def live_sequences(runner: ModelRunner) -> int:
    return runner.cache.num_live


def draft_runner(engine) -> ModelRunner:
    proposer = engine.proposer
    return getattr(proposer, "proposers", {}).get("draft", proposer).runner  # inside the CompositeProposer


def serve_at_once(engine, draft: ModelRunner, lengths: list[int], max_new: int, seed: int) -> dict:
    """Submit every request, step the engine to the end; concurrency per round in both models: the
    target's running sequences (admitted, each with its reserve of blocks) and the sequences the
    draft's cache holds (it takes a row when its own blocks can reserve it); and the TTFT (from the
    common submission to the first token) of the long prompts (>= LONG_PROMPT tokens), which
    admission past a blocked head must not starve."""
    rng, context = random.Random(seed), engine.verifier.max_seq_len
    ids = [engine.add_request(GenerationRequest([rng.randrange(1, 4000) for _ in range(n)],
                                                min(max_new, context - n), ignore_eos=True)) for n in lengths]
    long_ids = {seq_id for seq_id, n in zip(ids, lengths) if n >= LONG_PROMPT}
    peak, queued, ttft = [0, 0], [[], []], {}
    failed, start = 0, time.perf_counter()
    while engine.has_unfinished():
        for output in engine.step():
            if output.seq_id in long_ids and output.new_token_ids:
                ttft.setdefault(output.seq_id, time.perf_counter() - start)
        counts = (engine.num_running, live_sequences(draft))
        peak = [max(p, c) for p, c in zip(peak, counts)]
        if engine.num_waiting:
            for kept, count in zip(queued, counts):
                kept.append(count)
    for seq_id in ids:
        try:
            engine.result(seq_id)
        except Exception:  # noqa: BLE001 - a failed request is what this counts
            failed += 1
    long_ttft = sorted(ttft.values()) or [0.0]
    return {"peak": peak, "queued_mean": [statistics.mean(q) if q else 0.0 for q in queued], "failed": failed,
            "preemptions": engine.preemptions, "seconds": time.perf_counter() - start, "long": len(long_ids),
            "long_ttft": (statistics.median(long_ttft), long_ttft[min(len(long_ttft) - 1, int(0.99 * len(long_ttft)))])}


def slot_cache_sequences(runner: ModelRunner) -> int:
    """Sequences a slot cache of the same memory holds: one max_seq_len slot each."""
    blocks, size = runner.block_capacity
    return blocks * size // runner.max_seq_len


def ttft_ratio(runner: ModelRunner, repeats: int, prefix_len: int = 512, suffix_len: int = 32) -> tuple[float, float]:
    """(uncached, cached) median prefill seconds of a prefix_len + suffix_len prompt."""
    rng = random.Random(1)
    uncached, cached = [], []
    for _ in range(repeats):
        prefix = [rng.randrange(1, runner.vocab_size) for _ in range(prefix_len)]
        for times in (uncached, cached):  # the first request fills the prefix cache for the second
            slot = runner.allocate_slot(prefix_len + suffix_len)
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
            slot = runner.allocate_slot(64 + tokens)
            runner.forward([slot], [list(range(1, 65))], last_only=True)
            start = time.perf_counter()
            for step in range(tokens):
                runner.forward([slot], [[5 + step % 50]], last_only=True)
            best[i] = max(best[i], tokens / (time.perf_counter() - start))
            runner.free_slot(slot)
    return best


def admitted_at_once(runner: ModelRunner, grants: CacheGrants, log_uniform: bool, max_new: int,
                     draws: int = 20) -> float:
    """Mean over ``draws`` seeded queues of how many requests, in arrival order, an empty pool of
    ``runner``'s size admits at once, each on the reserve the engine admits it on
    (`CacheGrants.admission`; block bookkeeping, no forwards)."""
    counts, context = [], runner.max_seq_len
    for seed in range(draws):
        cache = KVCache(1, runner.cache.num_slots, context, 1, 1, block_size=runner.cache.block_size,
                        num_blocks=runner.cache.num_blocks)
        lengths = prompt_lengths(4 * runner.cache.num_blocks // runner.cache.block_size, log_uniform, seed)
        waiting = [Sequence(f"s{i}", GenerationRequest(list(range(1, n + 1)), min(max_new, context - n)),
                            StopChecker(max_new, ())) for i, n in enumerate(lengths)]
        counts.append(cache.admits([grants.admission(seq) for seq in waiting]))
    return statistics.mean(counts)


def in_process(config) -> tuple:
    """The default config's in-process engine: (engine, target runner, draft runner, close)."""
    engine = build_engine(config).engine
    return engine, engine.verifier.runner, draft_runner(engine), lambda: None


def served(config, grants: bool = True) -> tuple:
    """The default config's engine over gRPC, as `specdec serve` runs it: a target and a draft
    worker (servicers on their own event-loop threads in this process, as the worker actors serve
    them; no Ray) and the router's clients (RemoteVerifier, RemoteProposer), which grow grants in
    the router's share of the target's blocks (``grants`` False: it admits on full reserves, as
    before the router grew grants): (engine, target runner, draft runner, close)."""
    from specdec.verifiers.target_verifier import TargetVerifier
    from specdec.wiring.engine_builder import load_runner
    from specdec_rpc.worker.draft_servicer import DraftServicer
    from specdec_rpc.worker.remote_proposer import RemoteProposer
    from specdec_rpc.worker.remote_verifier import RemoteVerifier
    from specdec_rpc.worker.target_servicer import TargetServicer
    from specdec_rpc.worker.worker_server import ServerThread

    target = TargetServicer(TargetVerifier(load_runner(config.models.target, config.models, config.cache)),
                            config.models.target, config.cache.num_slots)
    servers = [ServerThread(target), ServerThread(DraftServicer.from_config(config))]
    verifier_class = RemoteVerifier if grants else type("FullReserves", (RemoteVerifier,), {"grows_reserves": False})
    clients = [verifier_class(servers[0].address), RemoteProposer(servers[1].address)]
    engine = build_engine(config, *clients).engine

    def close() -> None:
        for part in (*clients, *servers):
            (part.close if hasattr(part, "close") else part.stop)()

    return engine, target.verifier.runner, servers[1].servicer.proposer.runner, close


PATHS = {"in-process": in_process, "served": served, "served-full-reserves": functools.partial(served, grants=False)}
DEFAULT_PATHS = ["in-process", "served"]
WORKLOADS = {"uniform": False, "log-uniform": True}  # prompt lengths drawn log-uniformly?


def concurrency_rows(args: argparse.Namespace) -> None:
    """Each workload on each path in turn (interleaved, so background load hits them alike)."""
    for name in args.workloads:
        log_uniform = WORKLOADS[name]
        for path in args.paths:
            engine, target, draft, close = PATHS[path](load_config())  # fresh, default config, no overrides
            try:
                run = serve_at_once(engine, draft, prompt_lengths(args.requests, log_uniform), args.max_new_tokens,
                                    seed=2)
            finally:
                close()
            concurrency_table(run, f"{name}, {path}", target, draft, args.requests)
        at_once = admitted_at_once(target, engine.scheduler.grants, log_uniform, args.max_new_tokens)
        slots = slot_cache_sequences(target)
        print(f"| admitted at once from a full queue, {name} (bookkeeping, mean of 20 draws) | {slots} "
              f"| {at_once:.1f} | {at_once / slots:.2f}x |")


def concurrency_table(run: dict, name: str, target: ModelRunner, draft: ModelRunner, requests: int) -> None:
    for k, (model, runner) in enumerate((("target", target), ("draft", draft))):
        slots = slot_cache_sequences(runner)
        print(f"| concurrent sequences, prompts 16-2,000 {name}, {model} (peak; mean while queued) | {slots} "
              f"| {run['peak'][k]}; {run['queued_mean'][k]:.1f} | {run['peak'][k] / slots:.2f}x; "
              f"{run['queued_mean'][k] / slots:.2f}x |")
    print(f"| failed requests of {requests}; preemptions ({name}; {run['seconds']:.0f} s) | | "
          f"{run['failed']}; {run['preemptions']} | |")
    median, p99 = run["long_ttft"]
    print(f"| TTFT of the {run['long']} prompts >= {LONG_PROMPT} tokens, {name} (median; p99), s, all sent "
          f"at once | | {median:.1f}; {p99:.1f} | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=200)
    parser.add_argument("--paths", type=lambda text: text.split(","), default=DEFAULT_PATHS,
                        help=f"the engines the concurrency rows run, in turn, comma-separated: {', '.join(PATHS)}")
    parser.add_argument("--workloads", type=lambda text: text.split(","), default=list(WORKLOADS),
                        help=f"prompt length draws of the concurrency rows, comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--concurrency-only", action="store_true", help="skip the TTFT and decode rows")
    args = parser.parse_args()
    for given, known in ((args.paths, PATHS), (args.workloads, WORKLOADS)):
        if unknown := set(given) - set(known):
            parser.error(f"unknown {sorted(unknown)}: choose from {list(known)}")
    torch.set_num_threads(1)
    cache = load_config().cache
    print(f"Default config: cache.memory_budget {cache.memory_budget} ({cache.kv_tokens} tokens per model), "
          f"num_slots {cache.num_slots}, max_seq_len {cache.max_seq_len}, block_size {cache.block_size}.\n")
    print("| measure | slot cache, same memory | paged (default config) | ratio |\n|---|---|---|---|")
    concurrency_rows(args)
    if args.concurrency_only:
        return
    runner = build_engine(load_config()).engine.verifier.runner
    uncached, cached = ttft_ratio(runner, args.repeats)
    print(f"| TTFT, 512-token prefix (uncached / cached), ms | {uncached * 1e3:.1f} | {cached * 1e3:.1f} "
          f"| {cached / uncached:.2f}x |")
    path, context = resolve_model_path("bundled:target"), runner.max_seq_len
    contiguous = ModelRunner.from_pretrained(path, num_slots=2, max_seq_len=context, block_size=context)
    slot_tps, paged_tps = decode_tokens_per_s([contiguous, runner], args.decode_tokens, args.repeats)
    print(f"| single-stream decode tokens/s (one block per sequence / {cache.block_size}-token blocks) "
          f"| {slot_tps:.1f} | {paged_tps:.1f} | {paged_tps / slot_tps:.2f}x |")


if __name__ == "__main__":
    main()
