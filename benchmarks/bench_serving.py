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
* server, drafting ahead: the default configuration (speculation.overlap on): a lone
  request's rounds run in blocks with and without looking ahead (the draft drafting the next
  round for several verdicts of the round being verified), and the faster way is kept;
  steps with more requests run sequential rounds.

Every setup runs `--runs` times (3), interleaved: after starting a server stack, each run
measures the in-process reference and then the server at each level, so that a faster or
slower spell of the (shared) machine affects both alike. The tables show the median of the
runs; the last one each server setup's tokens/s over the in-process row measured just
before it, median and range over the runs.

A second table shows where a round's time went (means per round, ms: draft and target
compute, each call's hop, the router's bookkeeping, draft time hidden behind the verify
call, the whole round) and the look-ahead hit rate (share of look-aheads whose branch
matched the verdict: the next round's drafts were ready when it arrived).

Columns: tokens/s = all generated tokens / wall time; TTFT = time to the first chunk;
ITL = inter-token latency: each chunk's gap to the previous chunk of its stream, split
evenly over the chunk's tokens (a round confirms several tokens at once).

With `--profile NAME` the in-process engine and the served stack run on the same emulated
devices (configs/devices/NAME.yaml), and the tables add the framework cost per round (round
time minus the emulated device time on its critical path) and the goal ratios
(benchmarks/emulated_serving.py; results in benchmarks/results/bench_serving_emulated_NAME.json).

Usage: python benchmarks/bench_serving.py [--prompts 8] [--max-new-tokens 128] [--concurrency 1 4 8] [--runs 3]
       [--config override.yaml] [--json out.json] [--temperature 0]
       python benchmarks/bench_serving.py --profile h100-llama-8b-1b [--time-scale 1] [--concurrency 1 8 32]
       python benchmarks/bench_serving.py --profile h100-llama-8b-1b --streams-at-once 256 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import torch

from progress import Progress
from specdec.config.config import SpecdecConfig, load_config
from specdec.wiring.engine_builder import build_engine
from specdec.serving.async_engine import AsyncEngine
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from emulated_serving import DEVICE_PARTS, device_delta, device_totals, prompts_for

StreamFactory = Callable[[str, int], AsyncIterator[list[int]]]  # (prompt, max_new) -> token chunks
ProfileReader = Callable[[], Awaitable[dict]]  # -> {"rounds": n, "<part>_ms": mean per round, ...} (cumulative)
PROFILE_PARTS = ("draft_compute_ms", "draft_hop_ms", "target_compute_ms", "target_hop_ms", "bookkeeping_ms",
                 "overlapped_ms", "round_ms")


def profile_delta(before: dict, after: dict) -> dict:
    """Per-round means (ms) over the rounds between two cumulative profile readings (with
    emulated devices, their busy time per round and the framework cost: emulated_serving)."""
    rounds = after.get("rounds", 0) - before.get("rounds", 0)
    if rounds <= 0:
        return {}
    total = lambda reading, part: reading.get(part, 0.0) * reading.get("rounds", 0)  # noqa: E731
    ahead = after.get("ahead", 0) - before.get("ahead", 0)
    hits = after.get("ahead", 0) * after.get("hit_rate", 0.0) - before.get("ahead", 0) * before.get("hit_rate", 0.0)
    delta = {"rounds": rounds, **{p: (total(after, p) - total(before, p)) / rounds for p in PROFILE_PARTS},
             "hit_rate": hits / ahead if ahead > 0 else None}
    return {**delta, **device_delta(before, after, delta)}


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


class InProcess:
    """The in-process reference: AsyncEngine over the engine in this process (one torch
    thread per model, as each Ray worker actor gets), speculation mode ON."""

    def __init__(self, config: SpecdecConfig, max_streams: int, temperature: float = 0.0) -> None:
        torch.set_num_threads(1)
        self.sampling = SamplingParams(temperature=temperature)
        self.built = build_engine(config)
        self.loop = AsyncEngine(self.built.engine, max_concurrent_requests=max_streams)

    async def stream(self, prompt: str, n: int) -> AsyncIterator[list[int]]:
        # mode ON: the configured γ, as the server rows (AUTO would let the policy choose γ)
        async with self.loop.submit(GenerationRequest(self.built.encode(prompt), n, mode="on",
                                                         sampling=self.sampling)) as s:
            async for out in s:
                yield out.new_token_ids

    async def profile(self) -> dict:
        from specdec.models.emulated_device import process_devices

        profile = self.built.engine.profile
        return {"rounds": profile.rounds, **profile.means_ms(), **device_totals(process_devices())}

    def close(self) -> None:
        self.loop.shutdown()


async def measure(stream: StreamFactory, profile: ProfileReader, prompts: list[str], max_new: int, level: int,
                  label: str, run: int) -> dict:
    """One row: every prompt through `level` streams, with the round profile of that row."""
    before = await profile()
    row = {"setup": label, "run": run, **await run_level(stream, prompts, max_new, level)}
    after = await profile()
    row["profile"] = profile_delta(before, after)
    if after.get("look_ahead_tokens_per_s"):  # the lone row's measured choice at the row's end
        row["choice"] = {key: after[key] for key in ("look_ahead_tokens_per_s", "sequential_tokens_per_s",
                                                     "looking_ahead")}
    overlapped = row["profile"].get("overlapped_ms")
    shown = f", overlapped {overlapped:.1f} ms/round, choice {row.get('choice')}" if overlapped else ""
    print(f"  run {run}: {label} x{level}: {row['tokens_per_s']:.1f} tokens/s{shown}", flush=True)
    return row


def server_runs(config: SpecdecConfig, reference: InProcess, prompts: list[str], max_new: int, levels: list[int],
                label: str, progress: Progress, modes: tuple[str, ...], runs: int) -> list[dict]:
    """Start `specdec serve`'s stack on `config`; then `runs` times, for each level, the
    in-process reference and the server in every speculation mode, one after the other (so
    that a slower or faster spell of the machine affects all of them alike)."""
    from actors.app import free_port, start_app
    from specdec_rpc.public.client import AsyncSpecdecClient

    ports = {"port": free_port(), "http_port": free_port(), "direct_port": free_port(), "direct_http_port": free_port()}
    config = load_config(overrides={**config.model_dump(), "serving": {**config.serving.model_dump(), **ports}})
    app = start_app(config, ray_init_kwargs={"include_dashboard": False, "log_to_driver": False})

    async def main() -> list[dict]:
        rows = []
        async with contextlib.AsyncExitStack() as clients:
            client = await clients.enter_async_context(AsyncSpecdecClient(app.address, timeout_s=600.0))
            paths = [(label, client)]  # serving.ingress direct: also the router replicas' own ports, side by side
            if app.direct_addresses:
                direct = AsyncSpecdecClient(",".join(app.direct_addresses), timeout_s=600.0)
                paths.append((label.replace("server", "server direct", 1), await clients.enter_async_context(direct)))

            async def profile() -> dict:
                p = (await client.stats()).round_profile
                devices = await app.hub.emulated_devices.remote() if app.hub is not None else {}
                return {"rounds": p.rounds, "ahead": p.rows_drafted_ahead, "hit_rate": p.look_ahead_hit_rate,
                        "look_ahead_tokens_per_s": p.look_ahead_tokens_per_s,
                        "sequential_tokens_per_s": p.sequential_tokens_per_s, "looking_ahead": p.looking_ahead,
                        **{part: getattr(p, part) for part in PROFILE_PARTS},
                        **device_totals([d for found in devices.values() for d in found])}

            def served(mode: str, via: AsyncSpecdecClient) -> StreamFactory:
                async def stream(prompt: str, n: int) -> AsyncIterator[list[int]]:
                    async for chunk in via.generate_stream(prompt, max_new_tokens=n, mode=mode,
                                                            temperature=reference.sampling.temperature):
                        yield list(chunk.token_ids)
                return stream

            for stream in (reference.stream, *(served(modes[0], via) for _, via in paths)):  # warm-up
                await run_level(stream, prompts[:1], 8, 1)
            for run in range(1, runs + 1):
                for level in levels:
                    progress.step(f"{label}: run {run}, {level} streams")
                    texts = prompts_for(prompts, level)
                    rows.append(await measure(reference.stream, reference.profile, texts, max_new, level,
                                              "in-process", run))
                    for path, via in paths[:: 1 if run % 2 else -1]:  # the paths' order alternates by run
                        for mode in modes:
                            rows.append(await measure(served(mode, via), profile, texts, max_new, level,
                                                      f"{path}, speculation {mode}", run))
        return rows

    try:
        return asyncio.run(main())
    finally:
        app.shutdown()


def summary(rows: list[dict]) -> list[dict]:
    """One row per (setup, streams): the median over its runs of every figure (and of every
    part of the round profile)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["setup"], row["streams"]), []).append(row)
    out = []
    for (setup, streams), group in groups.items():
        figures = ("tokens", "tokens_per_s", "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms")
        medians = {key: statistics.median(r[key] for r in group) for key in figures}
        profiles = [r["profile"] for r in group if r.get("profile")]
        profile = {}
        if profiles:
            keys = ("rounds", *PROFILE_PARTS, *(k for k in DEVICE_PARTS if k in profiles[0]))
            profile = {key: statistics.median(p[key] for p in profiles) for key in keys}
            hits = [p["hit_rate"] for p in profiles if p.get("hit_rate") is not None]
            profile["hit_rate"] = statistics.median(hits) if hits else None
        out.append({"setup": setup, "streams": streams, "runs": len(group), **medians, "profile": profile})
    return out


def ratios(rows: list[dict], over: str = "in-process") -> list[dict]:
    """Each other setup's tokens/s over `over`'s, each taken against the `over` row measured
    just before it (same run and streams), then the median and range over the runs."""
    last: dict[int, dict] = {}  # streams -> the latest reference row
    found: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        if row["setup"] == over:
            last[row["streams"]] = row
        elif row["streams"] in last:
            found.setdefault((row["setup"], row["streams"]), []).append(
                row["tokens_per_s"] / last[row["streams"]]["tokens_per_s"])
    return [{"setup": setup, "streams": streams, "over": over, "median": statistics.median(v), "low": min(v),
             "high": max(v), "runs": len(v)} for (setup, streams), v in found.items()]


def ratio_markdown(found: list[dict]) -> str:
    lines = ["| setup | streams | tokens/s over in-process (median of runs) | range | runs |",
             "|---|---:|---:|---|---:|"]
    for r in found:
        lines.append(f"| {r['setup']} | {r['streams']} | {r['median']:.2f} | {r['low']:.2f}–{r['high']:.2f} "
                     f"| {r['runs']} |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| setup | streams | tokens | tokens/s | TTFT p50 (ms) | ITL p50 (ms) | ITL p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['streams']} | {r['tokens']:.0f} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.1f} "
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
            lines.append(f"| {r['setup']} | {r['streams']} | {round(p['rounds'])} | {parts} | {hit} |")
    return "\n".join(lines)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=None,
                        help="default 1 4 8 (1 8 32 with --profile)")
    parser.add_argument("--runs", type=int, default=3, help="runs of every setup, interleaved (medians reported)")
    parser.add_argument("--config", action="append", default=[], help="YAML override file(s)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature of every request (0: greedy; sampled rows carry the draft's q)")
    parser.add_argument("--profile", default=None, help="on emulated devices of this profile (configs/devices/): "
                        "in-process and served side by side with the framework cost per round (emulated_serving.py)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="with --profile: multiplies every device time")
    parser.add_argument("--streams-at-once", type=int, default=0, help="with --profile: only N concurrent streams "
                        "through one router: errors and the router's CPU time per token")
    args = parser.parse_args()
    args.concurrency = args.concurrency or ([1, 8, 32] if args.profile else [1, 4, 8])
    if args.profile:
        import sys

        import emulated_serving

        if args.streams_at_once:
            return emulated_serving.many_streams(args)
        return emulated_serving.run(args, sys.modules[__name__])
    prompts = bundled_prompts()[: args.prompts]
    stacks = [  # (label, speculation overrides, speculation modes)
        ("server", {"overlap": False}, ("on", "off")),
        ("server, drafting ahead", {"overlap": True}, ("on",)),  # the default: the measured choice
    ]
    levels, runs, n = args.concurrency, args.runs, args.max_new_tokens
    reference = InProcess(load_config(*args.config), max(levels), args.temperature)
    try:
        with Progress(len(stacks) * runs * len(levels), "bench_serving") as progress:
            rows = []
            for label, speculation, modes in stacks:
                config = load_config(*args.config, overrides={"speculation": speculation})
                rows += server_runs(config, reference, prompts, n, levels, label, progress, modes, runs)
    finally:
        reference.close()
    medians, found = summary(rows), ratios(rows)
    print(markdown(medians))
    print()
    print(profile_markdown(medians))
    print()
    print(ratio_markdown(found))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "medians": medians, "ratios": found}, f, indent=2)


if __name__ == "__main__":
    main()
