"""Serving benchmark: the distributed server (Ray actors + Serve gRPC) vs the in-process engine.

Workload: greedy, up to 128 new tokens for each held-out bundled prompt, draft-model
speculation at the configured γ (speculation mode ON over gRPC, so the load monitor does
not change γ). (EOS cannot be ignored over gRPC, so requests may stop
early; the table reports the tokens actually generated.) Each row runs all prompts with N
concurrent streams (N = 1, 4, 8), each stream taking the next prompt when it finishes:

* in-process: AsyncEngine over the engine in this process (one torch thread per model,
  as each Ray worker actor gets), speculation mode ON (the same γ as the server rows),
  streaming RoundOutputs;
* server: `specdec serve`'s stack started here (draft worker, target group, router behind
  Serve's gRPC proxy), streaming GenerateChunks with AsyncSpecdecClient: rounds one after
  the other (speculation.overlap false), with speculation ON and OFF (plain decoding);
* server, drafting ahead: the same with the default configuration (speculation.overlap:
  a lone request's draft drafts the next round for the likeliest verdicts while the
  target verifies; steps with more requests run sequential rounds).

A second table shows where a round's time went (means per round, ms: draft and target
compute, each call's hop, the router's bookkeeping, draft time hidden behind the verify
call, the whole round) and the look-ahead hit rate (share of look-aheads whose branch
matched the verdict: the next round's drafts were ready when it arrived).

Columns: tokens/s = all generated tokens / wall time; TTFT = time to the first chunk;
ITL = inter-token latency: each chunk's gap to the previous chunk of its stream, split
evenly over the chunk's tokens (a round confirms several tokens at once).

Usage: python benchmarks/bench_serving.py [--prompts 8] [--max-new-tokens 128] [--concurrency 1 4 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import torch

from progress import Progress
from specdec.config import SpecdecConfig, load_config
from specdec.engine_builder import build_engine
from specdec.async_engine import AsyncEngine
from specdec.model_paths import bundled_prompts
from specdec.request import GenerationRequest

StreamFactory = Callable[[str, int], AsyncIterator[list[int]]]  # (prompt, max_new) -> token chunks
ProfileReader = Callable[[], Awaitable[dict]]  # -> {"rounds": n, "<part>_ms": mean per round, ...} (cumulative)
PROFILE_PARTS = ("draft_compute_ms", "draft_hop_ms", "target_compute_ms", "target_hop_ms", "bookkeeping_ms",
                 "overlapped_ms", "round_ms")


def profile_delta(before: dict, after: dict) -> dict:
    """Per-round means (ms) over the rounds between two cumulative profile readings."""
    rounds = after.get("rounds", 0) - before.get("rounds", 0)
    if rounds <= 0:
        return {}
    total = lambda reading, part: reading.get(part, 0.0) * reading.get("rounds", 0)  # noqa: E731
    ahead = after.get("ahead", 0) - before.get("ahead", 0)
    hits = after.get("ahead", 0) * after.get("hit_rate", 0.0) - before.get("ahead", 0) * before.get("hit_rate", 0.0)
    return {"rounds": rounds, **{p: (total(after, p) - total(before, p)) / rounds for p in PROFILE_PARTS},
            "hit_rate": hits / ahead if ahead > 0 else None}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def timed_stream(chunks: AsyncIterator[list[int]]) -> tuple[int, float, list[float]]:
    """(tokens, time to first chunk, per-token inter-token latencies) of one stream."""
    start = last = time.perf_counter()
    tokens, ttft, itl = 0, float("nan"), []
    async for chunk in chunks:
        now = time.perf_counter()
        if not chunk:
            continue
        if tokens == 0:
            ttft = now - start
        else:
            itl.extend([(now - last) / len(chunk)] * len(chunk))
        tokens += len(chunk)
        last = now
    return tokens, ttft, itl


async def run_level(stream: StreamFactory, prompts: list[str], max_new: int, concurrency: int) -> dict:
    """All prompts through `concurrency` streams; returns the row's measurements."""
    queue = list(prompts)
    results = []

    async def worker() -> None:
        while queue:
            results.append(await timed_stream(stream(queue.pop(0), max_new)))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    tokens = sum(r[0] for r in results)
    itl = [x for r in results for x in r[2]]
    return {
        "streams": concurrency,
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "ttft_p50_ms": 1000 * statistics.median(r[1] for r in results),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
    }


async def run_all(
    stream: StreamFactory, prompts: list[str], max_new: int, levels: list[int], label: str, profile: ProfileReader,
    progress: Progress,
) -> list[dict]:
    await run_level(stream, prompts[:1], 8, 1)  # warm-up
    rows = []
    for level in levels:
        progress.step(f"{label}, {level} streams")
        before = await profile()
        row = {"setup": label, **await run_level(stream, prompts, max_new, level)}
        row["profile"] = profile_delta(before, await profile())
        rows.append(row)
        print(f"  {label} x{level}: {row['tokens_per_s']:.1f} tokens/s", flush=True)
    return rows


def in_process_rows(config: SpecdecConfig, prompts: list[str], max_new: int, levels: list[int],
                    progress: Progress) -> list[dict]:
    torch.set_num_threads(1)
    built = build_engine(config)
    loop = AsyncEngine(built.engine, max_concurrent_requests=max(levels))

    async def stream(prompt: str, n: int) -> AsyncIterator[list[int]]:
        # mode ON: the configured γ, as the server rows (AUTO would let the policy choose γ)
        async with loop.submit(GenerationRequest(built.encode(prompt), n, mode="on")) as s:
            async for out in s:
                yield out.new_token_ids

    async def profile() -> dict:
        return {"rounds": built.engine.profile.rounds, **built.engine.profile.means_ms()}

    try:
        return asyncio.run(run_all(stream, prompts, max_new, levels, "in-process", profile, progress))
    finally:
        loop.shutdown()


def server_rows(config: SpecdecConfig, prompts: list[str], max_new: int, levels: list[int], label: str,
                progress: Progress, modes: tuple[str, ...] = ("on",)) -> list[dict]:
    """Start `specdec serve`'s stack on `config` and run every level once per speculation mode."""
    from actors.app import free_port, start_app
    from specdec_rpc.client import AsyncSpecdecClient

    config = load_config(overrides={**config.model_dump(), "serving": {**config.serving.model_dump(), "port": free_port(), "http_port": free_port()}})
    app = start_app(config, ray_init_kwargs={"include_dashboard": False, "log_to_driver": False})

    async def main() -> list[dict]:
        rows = []
        async with AsyncSpecdecClient(app.address, timeout_s=600.0) as client:
            async def profile() -> dict:
                p = (await client.stats()).round_profile
                return {"rounds": p.rounds, "ahead": p.rows_drafted_ahead, "hit_rate": p.look_ahead_hit_rate,
                        **{part: getattr(p, part) for part in PROFILE_PARTS}}

            for mode in modes:
                async def stream(prompt: str, n: int) -> AsyncIterator[list[int]]:
                    # mode ON: the configured γ, as in-process (AUTO would follow the load monitor)
                    async for chunk in client.generate_stream(prompt, max_new_tokens=n, mode=mode):
                        yield list(chunk.token_ids)

                name = f"{label}, speculation {mode}"
                rows += await run_all(stream, prompts, max_new, levels, name, profile, progress)
        return rows

    try:
        return asyncio.run(main())
    finally:
        app.shutdown()


def markdown(rows: list[dict]) -> str:
    lines = [
        "| setup | streams | tokens | tokens/s | TTFT p50 (ms) | ITL p50 (ms) | ITL p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['streams']} | {r['tokens']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.1f} "
            f"| {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def profile_markdown(rows: list[dict]) -> str:
    """Where a round's time went, per setup and concurrency (means per round, ms)."""
    lines = [
        "| setup | streams | rounds | draft compute | draft hop | target compute | target hop | router "
        "| overlapped | round | look-ahead hit rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = r.get("profile") or {}
        if p:
            parts = " | ".join(f"{round(p[part], 2) or 0.0:.2f}" for part in PROFILE_PARTS)
            hit = "–" if p.get("hit_rate") is None else f"{p['hit_rate']:.0%}"
            lines.append(f"| {r['setup']} | {r['streams']} | {p['rounds']} | {parts} | {hit} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--config", action="append", default=[], help="YAML override file(s)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    config = load_config(*args.config)
    prompts = bundled_prompts()[: args.prompts]
    sequential = load_config(*args.config, overrides={"speculation": {"overlap": False}})
    pipelined = load_config(*args.config, overrides={"speculation": {"overlap": True}})
    levels = args.concurrency
    with Progress(4 * len(levels), "bench_serving") as progress:  # in-process, server ON / OFF, drafting ahead
        rows = in_process_rows(config, prompts, args.max_new_tokens, levels, progress)
        rows += server_rows(sequential, prompts, args.max_new_tokens, levels, "server", progress, ("on", "off"))
        rows += server_rows(pipelined, prompts, args.max_new_tokens, levels, "server, drafting ahead", progress)
    print(markdown(rows))
    print()
    print(profile_markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
