"""Load benchmark: speculation always ON vs always OFF vs AUTO (the goodput policy) over a QPS sweep.

One server (`specdec serve`'s stack: draft worker, target group, router behind Serve's gRPC
proxy, in-process load store) on the bundled pair. For each offered QPS the same seeded
open-loop Poisson arrival schedule of the same prompts is played once per policy, selected
per request with the gRPC speculation mode, and that `--repeats` times (3) with a fresh
schedule each time:

* on   -- mode ON with a fixed γ (--on-gamma, default the config's γ = 4): always speculate;
* off  -- mode OFF: plain batched decoding, no draft calls;
* auto -- mode AUTO: the goodput policy chooses every request's γ each round from the
          measured round costs and acceptance (γ = 0 for all under load); --disable-qps /
          --enable-qps add the operator's QPS override on top (off by default).

Each run lasts warm-up + duration seconds of arrivals; requests arriving in the warm-up
are sent but not measured. At a light load the measured interval is stretched so that at
least --min-requests (32) requests arrive in it on average: at 1 request/s a 12 s run held
about 10 requests, and AUTO's ITL p50 over ON's came out 1.13 in one sweep and 1.00 in a
40 s run of the same code on the same day. Between runs the benchmark waits until the
server is idle and the load window has emptied, so every run starts from the same state.
The policies' order rotates between repeats (ON OFF AUTO, OFF AUTO ON, AUTO ON OFF): this machine's speed drifts
by up to 1.7× within an hour and changes in spells of a minute or so, and runs of one policy
after another would otherwise compare a fast spell with a slow one. The order used to
alternate (ON OFF AUTO, then AUTO OFF ON), which put AUTO's two runs back to back: one slow
minute then held both (measured at 1 request/s: AUTO's γ = 4 rounds of one row took 48 ms
in both its runs, ON's 33 ms in the same sweep and AUTO's 36 ms in the next). Rotated, no
policy runs twice in a row and each takes each place once in three repeats. Each point
pools its repeats' requests.

Per (QPS, policy): requests measured / completed / rejected (RESOURCE_EXHAUSTED),
throughput = tokens streamed during the measurement interval / its length (all requests),
TTFT p50, ITL p50 / p99 (each chunk's gap to the previous chunk of its stream, split evenly
over the chunk's tokens), the mean ITL and the mean latency (sent to last token: the wait for
the first token, which the ITL leaves out, counted in), the share of chunks that carried a
single token (rounds that kept no draft: every round of plain decoding; a speculative round
whose first draft was rejected, which took a whole draft + verify for one token and makes
speculation's ITL tail) with their median gap, acceptance α = accepted / drafted
(final-chunk stats), and the fraction of requests that speculated (drafted > 0). Then, per
QPS, how close AUTO is to the better fixed policy, the one a user would pick at that load
(where both answer every request, the lower mean ITL: the faster-streaming answers;
otherwise the higher throughput): AUTO's tokens/s, ITL p50 and p99 over that policy's
(goals: ≥ 0.95, ≤ 1.10, ≤ 1.10), each with its range over the repeats; then, stricter,
AUTO's ITL p50 and p99 over the better of ON and OFF at each figure alone (ON's p50 and
OFF's p99 where each wins one); and a second plot of AUTO's γ and on/off state over time.

Defaults fit 2 CPU cores (~21 minutes): sampled requests (temperature 1, where the bundled
draft's acceptance is lower than greedy), 32 cache slots so that batches grow large
enough for the verify forward to dominate, loads from light to past saturation.

Usage: python benchmarks/bench_load.py [--qps 1 4 8 16 24] [--repeats 3] [--duration 12] [--warmup 6]
       [--min-requests 32] [--max-new-tokens 48] [--temperature 1.0] [--num-slots 32]
       [--plot PNG] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import percentile  # noqa: E402  (same percentile rule as the serving benchmark)
from progress import Progress  # noqa: E402

from specdec.config import SpecdecConfig, load_config  # noqa: E402
from specdec.model_paths import bundled_prompts  # noqa: E402

POLICIES = ("on", "off", "auto")
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class RequestResult:
    arrival: float  # scheduled arrival, seconds after the run's start
    measured: bool  # arrived after the warm-up
    tokens: int = 0
    ttft: float = float("nan")
    latency: float = float("nan")  # sent to last token, seconds (TTFT and every ITL: the whole answer)
    itl: list[float] = field(default_factory=list)
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (seconds after start, tokens)
    done: bool = False
    error: str = ""  # gRPC status name, "cancelled" (drain timeout) or ""
    drafted: int = 0
    accepted: int = 0
    gamma: int = 0
    speculation_enabled: bool = False


def poisson_schedule(qps: float, seconds: float, n_prompts: int, seed: int) -> list[tuple[float, int]]:
    """(arrival time, prompt index) of an open-loop Poisson process; the same for every policy."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(qps)
    while t < seconds:
        arrivals.append((t, rng.randrange(n_prompts)))
        t += rng.expovariate(qps)
    return arrivals


async def one_request(client, prompt: str, mode: str, max_new: int, start: float, res: RequestResult,
                      timeout_s: float, gamma: int = 0, temperature: float = 0.0) -> None:
    sent = last = time.perf_counter()
    try:
        async for chunk in client.generate_stream(prompt, max_new_tokens=max_new, mode=mode, gamma=gamma,
                                                  temperature=temperature, timeout_s=timeout_s):
            now = time.perf_counter()
            n = len(chunk.token_ids)
            if n:
                if res.tokens == 0:
                    res.ttft = now - sent
                else:
                    res.itl.extend([(now - last) / n] * n)
                res.tokens += n
                res.chunks.append((now - start, n))
                last = now
            if chunk.finish_reason:
                s = chunk.stats
                res.drafted, res.accepted, res.gamma = s.drafted, s.accepted, s.gamma
                res.speculation_enabled = s.speculation_enabled
        res.latency = last - sent
        res.done = True
    except grpc.RpcError as exc:
        res.error = exc.code().name if callable(getattr(exc, "code", None)) else type(exc).__name__
    except asyncio.CancelledError:
        res.error = "cancelled"


async def poll_switch(client, start: float, samples: list[tuple[float, bool, int, float, int]]) -> None:
    """Best effort: (t, on, γ, QPS estimate, requests running) from GetStats every 0.25 s; gives up at
    once when the server does not answer it (an older server without GetStats)."""
    from specdec_rpc.v1 import specdec_pb2

    async def stats():
        if hasattr(client, "stats"):
            return await client.stats(timeout_s=1.0)
        return await client._stub.GetStats(specdec_pb2.GetStatsRequest(), timeout=1.0)

    while True:
        try:
            r = await stats()
            samples.append((time.perf_counter() - start, r.speculation_enabled, r.gamma, r.qps, r.requests_running))
        except grpc.RpcError:
            if not samples:
                return
        await asyncio.sleep(0.25)


def measured_s(args: argparse.Namespace, qps: float) -> float:
    """The measured seconds of arrivals of a run at `qps`: --duration, or long enough for
    --min-requests requests on average, whichever is longer."""
    return max(args.duration, args.min_requests / qps)


async def run_point(client, prompts: list[str], schedule: list[tuple[float, int]], mode: str, gamma: int,
                    duration: float, args: argparse.Namespace) -> tuple[list[RequestResult], list, float]:
    """Play the schedule with one policy (`duration` measured seconds after the warm-up);
    returns the requests, the switch timeline and the time at which the run started (perf_counter)."""
    warmup, drain_s = args.warmup, args.drain_s
    start = time.perf_counter() + 0.05
    timeout_s = warmup + duration + drain_s + 30
    results, tasks, switch = [], [], []
    poller = asyncio.create_task(poll_switch(client, start, switch))
    try:
        for arrival, idx in schedule:
            delay = start + arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            res = RequestResult(arrival=arrival, measured=arrival >= warmup)
            results.append(res)
            tasks.append(asyncio.create_task(one_request(client, prompts[idx], mode, args.max_new_tokens, start, res,
                                                         timeout_s, gamma, args.temperature)))
        end_of_arrivals = start + warmup + duration
        await asyncio.sleep(max(0.0, end_of_arrivals - time.perf_counter()))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for t in tasks:
            t.cancel()
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
    return results, switch, start


def one_token_rounds(done: list[RequestResult]) -> tuple[float, float]:
    """(share of the streamed chunks after each request's first that carried one token,
    median gap before those chunks in ms). Such a chunk is a round that kept no draft (every
    round of plain decoding; a speculative round whose first draft was rejected)."""
    gaps = [(b[0] - a[0], b[1]) for r in done for a, b in zip(r.chunks, r.chunks[1:])]
    single = [gap for gap, n in gaps if n == 1]
    return (len(single) / len(gaps) if gaps else float("nan"),
            1000 * statistics.median(single) if single else float("nan"))


def summarize(qps: float, policy: str, runs: list[tuple[list[RequestResult], list]], warmup: float,
              duration: float) -> dict:
    """One (QPS, policy) point over its runs (repeats of the schedule, pooled: every measured
    request of every run counts once); the switch timeline shown is the first run's."""
    results = [r for run, _ in runs for r in run]
    measured = [r for r in results if r.measured]
    done = [r for r in measured if r.done]
    itl = [x for r in done for x in r.itl]
    window_tokens = sum(n for r in results for t, n in r.chunks if warmup <= t < warmup + duration)
    drafted = sum(r.drafted for r in done)
    accepted = sum(r.accepted for r in done)
    speculated = [r for r in done if r.drafted > 0 or r.speculation_enabled]
    measured_switch = [s for _, switch in runs for s in switch if warmup <= s[0] < warmup + duration]
    single_share, single_gap = one_token_rounds(done)
    return {
        "qps": qps,
        "policy": policy,
        "runs": len(runs),
        "sent": len(measured),
        "completed": len(done),
        "rejected": sum(r.error == "RESOURCE_EXHAUSTED" for r in measured),
        "failed": sum(bool(r.error) and r.error != "RESOURCE_EXHAUSTED" for r in measured),
        "duration_s": duration,
        "tokens_per_s": window_tokens / (duration * len(runs)),
        "ttft_p50_ms": 1000 * statistics.median(r.ttft for r in done) if done else float("nan"),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
        "itl_mean_ms": 1000 * statistics.mean(itl) if itl else float("nan"),
        "latency_mean_ms": 1000 * statistics.mean(r.latency for r in done) if done else float("nan"),
        "one_token_chunk_share": single_share,
        "one_token_gap_p50_ms": single_gap,
        "acceptance": accepted / drafted if drafted else None,
        "drafted": drafted,
        "accepted": accepted,
        "speculated_fraction": len(speculated) / len(done) if done else float("nan"),
        "mean_gamma": statistics.mean(r.gamma for r in speculated) if speculated else 0.0,
        # from GetStats (when the server has it): share of the measured time the switch was on
        "switch_on_fraction": (sum(s[1] for s in measured_switch) / len(measured_switch)) if measured_switch else None,
        "switch_timeline": [{"t": round(t, 2), "on": on, "gamma": g, "qps": round(q, 2), "running": n}
                            for t, on, g, q, n in runs[0][1]] if runs else [],
    }


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| QPS | policy | sent | done | rejected/failed | tokens/s | TTFT p50 (ms) | ITL p50 (ms) | ITL p99 (ms) "
        "| ITL mean (ms) | latency mean (ms) | 1-token chunks | their gap p50 (ms) | α | speculated |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['qps']:g} | {r['policy']} | {r['sent']} | {r['completed']} | {r['rejected'] + r['failed']} "
            f"| {fmt(r['tokens_per_s'])} | {fmt(r['ttft_p50_ms'])} | {fmt(r['itl_p50_ms'])} | {fmt(r['itl_p99_ms'])} "
            f"| {fmt(r.get('itl_mean_ms'))} | {fmt(r.get('latency_mean_ms'), '.0f')} "
            f"| {fmt(100 * r['one_token_chunk_share'], '.0f')}% "
            f"| {fmt(r['one_token_gap_p50_ms'])} "
            f"| {fmt(r['acceptance'], '.2f')} | {fmt(100 * r['speculated_fraction'], '.0f')}% |"
        )
    return "\n".join(lines)


GOALS = {"tokens_per_s": 0.95, "itl_p50_ms": 1.10, "itl_p99_ms": 1.10}  # AUTO / the better fixed policy


def serves_the_load(r: dict) -> bool:
    """Every measured request completed, none rejected or failed."""
    return r["completed"] == r["sent"] and not r["rejected"] and not r["failed"]


def better_policy(on: dict, off: dict) -> dict:
    """The fixed policy a user would pick at this load: where both serve it (every request
    answered; their tokens/s then differ only by which tokens fell inside the measured
    interval), the one whose answers stream faster: the lower mean ITL (1 / a request's
    goodput); otherwise the one with more throughput."""
    if serves_the_load(on) and serves_the_load(off):
        return min((on, off), key=lambda r: r["itl_mean_ms"])
    return max((on, off), key=lambda r: r["tokens_per_s"])


def ratios(on: dict, off: dict, auto: dict, per_figure: bool = False) -> dict:
    """AUTO over the better fixed policy (`better_policy`) at every figure; with per_figure,
    over the better of ON and OFF at each figure on its own (throughput: the higher; each ITL
    figure: the lower), which asks AUTO for ON's p50 and OFF's p99 where each wins one."""
    better = None if per_figure else better_policy(on, off)
    out = {}
    for key in GOALS:
        pick = max if key == "tokens_per_s" else min
        reference = pick(on[key], off[key]) if better is None else better[key]
        out[key] = auto[key] / reference if reference else float("nan")
    return out


def met(r: dict) -> bool:
    return (r["tokens_per_s"] >= GOALS["tokens_per_s"] and r["itl_p50_ms"] <= GOALS["itl_p50_ms"]
            and r["itl_p99_ms"] <= GOALS["itl_p99_ms"])


def closeness(rows: list[dict], repeats: list[list[dict]] = ()) -> tuple[str, list[dict]]:
    """Per QPS: AUTO vs the better fixed policy (`better_policy`) on the pooled runs
    (throughput: goal ≥ 0.95; ITL p50 and p99: goal ≤ 1.10), each ratio with its range over
    the repeats (`repeats`: the rows of each repeat alone; a ratio of pooled figures need not
    lie between the repeats' ratios, which differ in size and speed); then, stricter, AUTO's
    ITL against the better of ON and OFF at each figure on its own (`best_by_figure`, e.g.
    "off, on, off": ON's p50 and OFF's p99) and whether the goals hold that way too."""
    by = {(r["qps"], r["policy"]): r for r in rows}
    each = [{(r["qps"], r["policy"]): r for r in rep} for rep in repeats]
    lines = [
        "| QPS | ON / OFF tokens/s | ON / OFF mean ITL | ON / OFF mean latency | better "
        "| AUTO / better tokens/s (≥ 0.95) "
        "| AUTO / better ITL p50 (≤ 1.10) | AUTO / better ITL p99 (≤ 1.10) | goals met "
        "| best tokens/s, ITL p50, p99 | AUTO / best ITL p50, p99 | met per figure | AUTO requests speculated |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---|---|---|---|---:|",
    ]
    out = []
    for qps in sorted({r["qps"] for r in rows}):
        on, off, auto = (by.get((qps, p)) for p in POLICIES)
        if not (on and off and auto):
            continue
        best = [max((on, off), key=lambda r: r["tokens_per_s"])["policy"],
                *(min((on, off), key=lambda r: r[k])["policy"] for k in ("itl_p50_ms", "itl_p99_ms"))]
        c = {"qps": qps, "better": better_policy(on, off)["policy"], "best_by_figure": best,
             "on_over_off": on["tokens_per_s"] / off["tokens_per_s"],
             "on_over_off_itl_mean": on["itl_mean_ms"] / off["itl_mean_ms"],
             "on_over_off_latency_mean": on.get("latency_mean_ms", math.nan)
             / off.get("latency_mean_ms", math.nan)}
        spread = [ratios(*(rep[(qps, p)] for p in POLICIES)) for rep in each
                  if all((qps, p) in rep for p in POLICIES)]
        cells = []
        for key, value in ratios(on, off, auto).items():
            c[f"auto_{key}_ratio"] = value
            span = [min(r[key] for r in spread), max(r[key] for r in spread)] if spread else None
            c[f"auto_{key}_ratio_range"] = span
            cells.append(fmt(value, ".2f") + (f" ({span[0]:.2f}–{span[1]:.2f})" if span and len(spread) > 1 else ""))
        strict = ratios(on, off, auto, per_figure=True)
        c["auto_over_best_by_figure"] = strict
        c["auto_speculated_fraction"] = auto["speculated_fraction"]
        c["goals_met"] = met({k: c[f"auto_{k}_ratio"] for k in GOALS})
        c["goals_met_per_figure"] = met(strict)
        out.append(c)
        lines.append(
            f"| {qps:g} | {c['on_over_off']:.2f} | {c['on_over_off_itl_mean']:.2f} "
            f"| {fmt(c['on_over_off_latency_mean'], '.2f')} | {c['better']} "
            f"| {' | '.join(cells)} | {'yes' if c['goals_met'] else 'no'} | {', '.join(best)} "
            f"| {strict['itl_p50_ms']:.2f}, {strict['itl_p99_ms']:.2f} | {'yes' if c['goals_met_per_figure'] else 'no'} "
            f"| {fmt(100 * c['auto_speculated_fraction'], '.0f')}% |"
        )
    return "\n".join(lines), out


def plot_timeline(rows: list[dict], path: Path, warmup: float) -> None:
    """AUTO's γ (largest given in the last round), on/off state and requests running over
    each run, one panel per QPS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    autos = [r for r in rows if r["policy"] == "auto" and r["switch_timeline"]]
    if not autos:
        return
    fig, axes = plt.subplots(1, len(autos), figsize=(4.2 * len(autos), 3.6), squeeze=False)
    for ax, r in zip(axes[0], autos):
        tl = r["switch_timeline"]
        t = [s["t"] for s in tl]
        ax.step(t, [s["gamma"] for s in tl], where="post", color="tab:green", label="γ (largest this round)")
        ax.fill_between(t, 0, [8 if s["on"] else 0 for s in tl], step="post", color="tab:green", alpha=0.1,
                        label="speculation on")
        twin = ax.twinx()
        twin.plot(t, [s.get("running", 0) for s in tl], color="tab:gray", linewidth=1, label="requests running")
        twin.set_ylabel("requests running")
        ax.axvspan(0, warmup, color="k", alpha=0.05)
        ax.set_xlim(0, warmup + r["duration_s"] + 2)
        ax.set_ylim(0, 8.5)
        ax.set_title(f"{r['qps']:g} requests/s")
        ax.set_xlabel("seconds since the run started (grey: warm-up)")
        ax.set_ylabel("γ")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.suptitle("AUTO: the goodput policy's γ and on/off state follow the load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = [("tokens_per_s", "throughput (tokens/s)", False), ("itl_p50_ms", "inter-token latency p50 (ms)", False),
              ("ttft_p50_ms", "time to first token p50 (ms)", True)]
    styles = {"on": ("tab:blue", "o", "speculation ON"), "off": ("tab:orange", "s", "speculation OFF"),
              "auto": ("tab:green", "^", "AUTO (load monitor)")}
    for ax, (key, label, log) in zip(axes, panels):
        for policy in POLICIES:
            pts = sorted((r["qps"], r[key]) for r in rows if r["policy"] == policy)
            if pts:
                color, marker, name = styles[policy]
                ax.plot(*zip(*pts), marker=marker, color=color, label=name,
                        linestyle="--" if policy == "auto" else "-", linewidth=2 if policy == "auto" else 1.5)
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def server_config(args: argparse.Namespace) -> SpecdecConfig:
    from actors.app import free_port

    return load_config(*args.config, overrides={
        "cache": {"num_slots": args.num_slots},
        "serving": {"port": free_port(), "http_port": free_port(), "max_concurrent_requests": args.max_concurrent},
        "load_monitor": {
            "enabled": True,
            "redis_url": "",  # in-process store: one router replica
            "window_s": args.window_s,
            "bucket_s": min(1.0, args.window_s / 4),
            "stale_after_s": max(3.0, args.window_s),
            "disable_qps": args.disable_qps,  # the operator's override: None = the goodput plan alone
            "enable_qps": args.enable_qps,
            "min_dwell_s": args.min_dwell_s,
        },
    })


def run_order(policies: list[str], repeat: int) -> list[str]:
    """The policies' order in a repeat: rotated by one place per repeat, so that no policy runs
    twice in a row (the last of one repeat is not the first of the next) and, over as many
    repeats as policies, each runs once in every place. Two policies keep their order (A B,
    A B): rotated, they would meet themselves (A B, B A)."""
    shift = repeat % len(policies) if len(policies) > 2 else 0
    return list(policies[shift:]) + list(policies[:shift])


async def sweep(address: str, args: argparse.Namespace, prompts: list[str]) -> tuple[list[dict], list[list[dict]]]:
    """Every QPS, every policy, `--repeats` times. Within a repeat each policy plays the same
    schedule; the order rotates (`run_order`), so that a machine whose speed drifts during
    the sweep does not favour whichever policy runs first or twice in a row. Returns
    the pooled rows and each repeat's own rows (for the ratios' spread)."""
    from specdec_rpc.client import AsyncSpecdecClient

    runs: dict[tuple[float, str], list] = {}
    repeats: list[list[dict]] = [[] for _ in range(args.repeats)]
    async with AsyncSpecdecClient(address, timeout_s=120.0) as client:
        # warm the whole path (draft, target, both modes) once; not measured
        await asyncio.gather(*(one_request(client, prompts[i], m, 8, time.perf_counter(), RequestResult(0, False), 60)
                               for i, m in enumerate(("on", "off"))))
        with Progress(len(args.qps) * len(args.policies) * args.repeats, "bench_load") as progress:
            for k, qps in enumerate(args.qps):
                for rep in range(args.repeats):
                    schedule = poisson_schedule(qps, args.warmup + measured_s(args, qps), len(prompts),
                                                args.seed * 1000 + k + 100 * rep)
                    order = run_order(args.policies, rep)
                    for policy in order:
                        progress.step(f"{qps:g} requests/s, repeat {rep + 1}, policy {policy}")
                        run, row = await play(client, prompts, schedule, qps, policy, args)
                        runs.setdefault((qps, policy), []).append(run)
                        repeats[rep].append(row)
    rows = [summarize(qps, policy, point, args.warmup, measured_s(args, qps)) for (qps, policy), point in runs.items()]
    return rows, repeats


async def play(client, prompts: list[str], schedule: list[tuple[float, int]], qps: float, policy: str,
               args: argparse.Namespace) -> tuple[tuple[list[RequestResult], list], dict]:
    """One run of the schedule with one policy, then wait until the next run can start from
    the same state: idle and the load window empty (the switch back on after its dwell).
    Returns the run (requests, switch timeline) and its own summary."""
    gamma = args.on_gamma if policy == "on" else 0
    duration = measured_s(args, qps)
    results, switch, start = await run_point(client, prompts, schedule, policy, gamma, duration, args)
    row = summarize(qps, policy, [(results, switch)], args.warmup, duration)
    print(f"  qps {qps:g} {policy:>4}: {row['completed']}/{row['sent']} done, "
          f"{row['tokens_per_s']:.1f} tokens/s, ITL p50 {fmt(row['itl_p50_ms'])} ms, "
          f"p99 {fmt(row['itl_p99_ms'])} ms, speculated {fmt(100 * row['speculated_fraction'], '.0f')}%", flush=True)
    settle = args.window_s + args.min_dwell_s + 0.5
    last_arrival = start + (schedule[-1][0] if schedule else 0.0)
    await asyncio.sleep(max(0.0, last_arrival + settle - time.perf_counter()))
    return (results, switch), row


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _shutdown(app) -> None:
    """Stop the server; a second Ctrl-C / SIGTERM meanwhile does not cut the shutdown short."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        app.shutdown()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, nargs="+", default=[1.0, 4.0, 8.0, 16.0, 24.0],
                        help="offered loads (requests/s)")
    parser.add_argument("--duration", type=float, default=12.0, help="measured seconds of arrivals per run")
    parser.add_argument("--min-requests", type=float, default=32.0,
                        help="light loads: stretch a run's measured interval to this many arrivals on average")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each (QPS, policy), pooled; the policies' order rotates between repeats")
    parser.add_argument("--warmup", type=float, default=6.0, help="unmeasured seconds of arrivals first (policy settles)")
    parser.add_argument("--drain-s", type=float, default=30.0, help="most seconds to wait for a run's last requests")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--on-gamma", type=int, default=None,
                        help="γ of the ON policy (default: the config's speculation.gamma; 0 = the server's policy)")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--seed", type=int, default=0, help="seeds the arrival schedules and prompt choice")
    parser.add_argument("--num-slots", type=int, default=32, help="cache.num_slots (sequences decoded at once)")
    parser.add_argument("--max-concurrent", type=int, default=64, help="serving.max_concurrent_requests")
    parser.add_argument("--window-s", type=float, default=4.0, help="load_monitor.window_s")
    parser.add_argument("--min-dwell-s", type=float, default=1.0, help="load_monitor.min_dwell_s")
    parser.add_argument("--disable-qps", type=float, default=None, help="load_monitor.disable_qps (override; default none)")
    parser.add_argument("--enable-qps", type=float, default=None, help="load_monitor.enable_qps (with --disable-qps)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every request (0 = greedy)")
    parser.add_argument("--config", action="append", default=[], help="YAML override file(s) under the above")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "load_sweep.png", help="PNG output")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw rows to this JSON file")
    args = parser.parse_args()
    if any(q <= 0 for q in args.qps) or args.duration <= 0 or args.warmup < 0 or args.repeats < 1 \
            or args.min_requests < 0:
        parser.error("--qps values and --duration must be > 0, --warmup and --min-requests >= 0, --repeats >= 1")

    from actors.app import start_app

    # SIGTERM takes the Ctrl-C path, so the server is shut down either way (set again after
    # ray.init, which installs its own handler)
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.perf_counter()
    config = server_config(args)
    if args.on_gamma is None:
        args.on_gamma = config.speculation.gamma
    prompts = bundled_prompts()
    print(f"starting the server on {config.serving.port} ...", flush=True)
    app = start_app(config, ray_init_kwargs={"include_dashboard": False, "log_to_driver": False})
    try:
        signal.signal(signal.SIGTERM, _interrupt)
        print(f"server ready after {time.perf_counter() - t0:.0f}s", flush=True)
        rows, repeats = asyncio.run(sweep(app.address, args, prompts))
    except KeyboardInterrupt:
        print("interrupted; shutting the server down", flush=True)
        raise
    finally:
        _shutdown(app)

    print()
    print(markdown(rows))
    print()
    table, close = closeness(rows, repeats)
    if close:
        print(f"AUTO vs the better fixed policy at each QPS, {args.repeats} repeats pooled, each repeat's range in "
              "brackets (tokens/s ratio: higher is better, 1.00 = as good; ITL ratios: lower is better, 1.00 = as good):")
        print()
        print(table)
    lm = config.load_monitor
    override = f"; operator override off above {lm.disable_qps:g} req/s" if lm.disable_qps is not None else ""
    sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}"
    title = (f"bundled pair, {sampling}, {args.max_new_tokens} new tokens, {args.num_slots} slots, "
             f"{args.repeats} × {args.duration:g}s (≥ {args.min_requests:g} requests) per point; "
             f"AUTO = goodput plan{override}")
    plot(rows, args.plot, title)
    timeline_path = args.plot.with_name(args.plot.stem + "_timeline.png")
    plot_timeline(rows, timeline_path, args.warmup)
    print(f"\nplots: {args.plot}, {timeline_path}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                         "rows": rows, "auto_vs_best": close,
                                         "repeats": [[{k: v for k, v in r.items() if k != "switch_timeline"} for r in rep]
                                                     for rep in repeats]}, indent=2))
        print(f"rows: {args.json}")
    print(f"total runtime: {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
