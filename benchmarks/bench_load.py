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
The summaries, tables, verdict and plots are `load_report.py`'s.

SLO attainment (`slo_report.py`): with `--tpot-target-ms` every request carries that
time-per-output-token target (speculation.tpot_target_ms: AUTO plans within it, ON and OFF
ignore it), and each point reports its TPOT p50 and the share of requests that met the
target (and `--ttft-target-ms`, when given); a second verdict then asks AUTO for ≥ 0.95 × the
better fixed policy's tokens/s and ≥ its attainment (the better: the higher attainment).
Attainment against a target in the middle of the TPOT distribution swings with the
machine's speed far more than with the policy, so a third table says how far that verdict
can be trusted (`slo_report.slo_spread`): each policy's attainment range over the repeats,
and AUTO's gap to the better policy paired within each repeat (the same schedule, minutes
apart), its mean ± 2 standard errors; a shortfall is "missed" only beyond that noise.
Every (load, repeat) has its own seeded schedule (`schedule_seed`: arrivals and prompt
choice), the same whichever other loads the sweep runs, so a point can be rerun alone.

Emulated devices (`--profile NAME`, configs/devices/NAME.yaml; docs/emulated_devices.md):
the same server on an emulated target and draft whose forwards take the profile's times
(`--time-scale` multiplies them); the stack above the models is the production code.

Defaults fit 2 CPU cores (~21 minutes): sampled requests (temperature 1, where the bundled
draft's acceptance is lower than greedy), 32 cache slots so that batches grow large
enough for the verify forward to dominate, loads from light to past saturation.

Usage: python benchmarks/bench_load.py [--qps 1 4 8 16 24] [--repeats 3] [--duration 12] [--warmup 6]
       [--min-requests 32] [--max-new-tokens 48] [--temperature 1.0] [--num-slots 32]
       [--profile h100-llama-8b-1b [--time-scale 1]] [--tpot-target-ms MS] [--ttft-target-ms MS]
       [--plot PNG] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_report import POLICIES, RequestResult, closeness, fmt, markdown, plot, plot_timeline, summarize  # noqa: E402
from progress import Progress  # noqa: E402
from slo_report import slo_spread, slo_table, target_effect  # noqa: E402

from specdec.config.config import SpecdecConfig, load_config  # noqa: E402
from specdec.models.model_paths import bundled_prompts  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def poisson_schedule(qps: float, seconds: float, n_prompts: int, seed: int | str) -> list[tuple[float, int]]:
    """(arrival time, prompt index) of an open-loop Poisson process; the same for every policy."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(qps)
    while t < seconds:
        arrivals.append((t, rng.randrange(n_prompts)))
        t += rng.expovariate(qps)
    return arrivals


async def one_request(client, prompt: str, mode: str, max_new: int, start: float, res: RequestResult,
                      timeout_s: float, gamma: int = 0, temperature: float = 0.0,
                      tpot_target_ms: float | None = None) -> None:
    sent = last = time.perf_counter()
    try:
        async for chunk in client.generate_stream(prompt, max_new_tokens=max_new, mode=mode, gamma=gamma,
                                                  temperature=temperature, timeout_s=timeout_s,
                                                  tpot_target_ms=tpot_target_ms):
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


async def poll_switch(client, start: float, samples: list[tuple[float, bool, int, float, int, str]]) -> None:
    """Best effort: (t, on, γ, QPS estimate, requests running, the decision's reason) from GetStats
    every 0.25 s; gives up at once when the server does not answer it (an older server without GetStats)."""
    from specdec_rpc.v1 import specdec_pb2

    async def stats():
        if hasattr(client, "stats"):
            return await client.stats(timeout_s=1.0)
        return await client._stub.GetStats(specdec_pb2.GetStatsRequest(), timeout=1.0)

    while True:
        try:
            r = await stats()
            samples.append((time.perf_counter() - start, r.speculation_enabled, r.gamma, r.qps, r.requests_running,
                            r.reason))
        except grpc.RpcError:
            if not samples:
                return
        await asyncio.sleep(0.25)


def schedule_seed(seed: int, qps: float, repeat: int) -> str:
    """The seed of one (load, repeat)'s arrivals and prompt choice: the same whichever other
    loads the sweep runs and in which order, so a point can be rerun alone (Python seeds
    `random.Random` from a string deterministically)."""
    return f"{seed}:{qps:g}:{repeat}"


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
            tasks.append(asyncio.create_task(one_request(client, prompts[idx], "auto" if mode == UNTARGETED else mode,
                                                         args.max_new_tokens, start, res, timeout_s, gamma,
                                                         args.temperature, sent_target_ms(args, mode))))
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


UNTARGETED = "auto-free"  # a fourth policy: mode AUTO with no TPOT target sent, judged at the target all the same


def sent_target_ms(args: argparse.Namespace, policy: str = "") -> float | None:
    """The TPOT target a request carries: --tpot-target-ms, or none with --judge-only and
    for the policy auto-free (AUTO planning for tokens/s alone, judged at the target: the
    target's own effect on AUTO, in the same sweep)."""
    return None if args.judge_only or policy == UNTARGETED else args.tpot_target_ms


def server_config(args: argparse.Namespace) -> SpecdecConfig:
    from actors.app import free_port

    models = {}
    if args.profile:
        models = {"target": f"emulated:{args.profile}:target", "draft": f"emulated:{args.profile}:draft",
                  "device_time_scale": args.time_scale}
    return load_config(*args.config, overrides={
        "models": models,
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
            # the server's default too (the on/off state is judged with it); none where some requests go without
            "tpot_target_ms": None if UNTARGETED in args.policies else sent_target_ms(args),
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
    from specdec_rpc.public.client import AsyncSpecdecClient

    runs: dict[tuple[float, str], list] = {}
    repeats: list[list[dict]] = [[] for _ in range(args.repeats)]
    async with AsyncSpecdecClient(address, timeout_s=120.0) as client:
        # warm the whole path (draft, target, both modes) once; not measured
        await asyncio.gather(*(one_request(client, prompts[i], m, 8, time.perf_counter(), RequestResult(0, False), 60)
                               for i, m in enumerate(("on", "off"))))
        with Progress(len(args.qps) * len(args.policies) * args.repeats, "bench_load") as progress:
            for qps in args.qps:
                for rep in range(args.repeats):
                    schedule = poisson_schedule(qps, args.warmup + measured_s(args, qps), len(prompts),
                                                schedule_seed(args.seed, qps, rep))
                    order = run_order(args.policies, rep)
                    for policy in order:
                        progress.step(f"{qps:g} requests/s, repeat {rep + 1}, policy {policy}")
                        run, row = await play(client, prompts, schedule, qps, policy, args)
                        runs.setdefault((qps, policy), []).append(run)
                        repeats[rep].append(row)
    rows = [point_summary(qps, policy, point, args) for (qps, policy), point in runs.items()]
    return rows, repeats


def point_summary(qps: float, policy: str, runs: list, args: argparse.Namespace) -> dict:
    """One (QPS, policy) point over its runs, with SLO attainment against the targets given."""
    return summarize(qps, policy, runs, args.warmup, measured_s(args, qps), args.tpot_target_ms, args.ttft_target_ms)


async def play(client, prompts: list[str], schedule: list[tuple[float, int]], qps: float, policy: str,
               args: argparse.Namespace) -> tuple[tuple[list[RequestResult], list], dict]:
    """One run of the schedule with one policy, then wait until the next run can start from
    the same state: idle and the load window empty (the switch back on after its dwell).
    Returns the run (requests, switch timeline) and its own summary."""
    gamma = args.on_gamma if policy == "on" else 0
    duration = measured_s(args, qps)
    results, switch, start = await run_point(client, prompts, schedule, policy, gamma, duration, args)
    row = point_summary(qps, policy, [(results, switch)], args)
    slo = "" if row["slo_attainment"] is None else f", SLO met {fmt(100 * row['slo_attainment'], '.0f')}%"
    print(f"  qps {qps:g} {policy:>4}: {row['completed']}/{row['sent']} done, "
          f"{row['tokens_per_s']:.1f} tokens/s, ITL p50 {fmt(row['itl_p50_ms'])} ms, "
          f"p99 {fmt(row['itl_p99_ms'])} ms, TPOT p50 {fmt(row['tpot_p50_ms'])} ms, "
          f"speculated {fmt(100 * row['speculated_fraction'], '.0f')}%{slo}", flush=True)
    middle = [s for s in switch if s[0] >= args.warmup + duration / 2]
    if policy == "auto" and middle:  # what the policy said halfway through the measured interval
        print(f"    auto's plan then: {middle[0][5]}", flush=True)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, nargs="+", default=[1.0, 4.0, 8.0, 16.0, 24.0],
                        help="offered loads (requests/s)")
    parser.add_argument("--duration", type=float, default=12.0, help="measured seconds of arrivals per run")
    parser.add_argument("--min-requests", type=float, default=32.0,
                        help="light loads: stretch a run's measured interval to this many arrivals on average")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each (QPS, policy), pooled; the policies' order rotates between repeats")
    parser.add_argument("--warmup", type=float, default=6.0,
                        help="unmeasured seconds of arrivals first (policy settles)")
    parser.add_argument("--drain-s", type=float, default=30.0, help="most seconds to wait for a run's last requests")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--on-gamma", type=int, default=None,
                        help="γ of the ON policy (default: the config's speculation.gamma; 0 = the server's policy)")
    parser.add_argument("--policies", nargs="+", choices=(*POLICIES, UNTARGETED), default=list(POLICIES),
                        help=f"{UNTARGETED}: mode AUTO without the TPOT target (shown beside AUTO, not judged)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the arrival schedules and prompt choice")
    parser.add_argument("--num-slots", type=int, default=32, help="cache.num_slots (sequences decoded at once)")
    parser.add_argument("--max-concurrent", type=int, default=64, help="serving.max_concurrent_requests")
    parser.add_argument("--window-s", type=float, default=4.0, help="load_monitor.window_s")
    parser.add_argument("--min-dwell-s", type=float, default=1.0, help="load_monitor.min_dwell_s")
    parser.add_argument("--disable-qps", type=float, default=None,
                        help="load_monitor.disable_qps (override; default none)")
    parser.add_argument("--enable-qps", type=float, default=None, help="load_monitor.enable_qps (with --disable-qps)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature of every request (0 = greedy)")
    parser.add_argument("--profile", default=None,
                        help="emulated devices: configs/devices/NAME.yaml (or a .yaml path) as target and draft")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="with --profile: multiplies every emulated device time (models.device_time_scale)")
    parser.add_argument("--tpot-target-ms", type=float, default=None,
                        help="every request's time-per-output-token target (speculation.tpot_target_ms); "
                             "reports SLO attainment")
    parser.add_argument("--judge-only", action="store_true",
                        help="judge attainment at --tpot-target-ms without sending it: AUTO plans for tokens/s alone")
    parser.add_argument("--ttft-target-ms", type=float, default=None,
                        help="time-to-first-token target of the SLO attainment (reported only; not sent)")
    parser.add_argument("--config", action="append", default=[], help="YAML override file(s) under the above")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "load_sweep.png", help="PNG output")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw rows to this JSON file")
    args = parser.parse_args(argv)
    if any(q <= 0 for q in args.qps) or args.duration <= 0 or args.warmup < 0 or args.repeats < 1 \
            or args.min_requests < 0:
        parser.error("--qps values and --duration must be > 0, --warmup and --min-requests >= 0, --repeats >= 1")
    if any(t is not None and not 0 < t < float("inf") for t in (args.tpot_target_ms, args.ttft_target_ms)) \
            or args.time_scale < 0:
        parser.error("--tpot-target-ms and --ttft-target-ms must be > 0 and finite, --time-scale >= 0")
    return args


def main() -> None:
    args = parse_args()
    from actors.app import start_app

    # SIGTERM takes the Ctrl-C path, so the server is shut down either way (set again after
    # ray.init, which installs its own handler)
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.perf_counter()
    config = server_config(args)
    if args.on_gamma is None:
        args.on_gamma = config.speculation.gamma
    prompts = bundled_prompts()
    where = f"emulated devices {args.profile} (device times x{args.time_scale:g})" if args.profile else "this CPU"
    print(f"starting the server on {config.serving.port} ({where}) ...", flush=True)
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
    report(args, config, rows, repeats)
    print(f"total runtime: {time.perf_counter() - t0:.0f}s")


def report(args: argparse.Namespace, config: SpecdecConfig, rows: list[dict], repeats: list[list[dict]]) -> None:
    """Print the tables, draw both plots and write the raw rows (--json)."""
    print()
    print(markdown(rows))
    print()
    table, close = closeness(rows, repeats)
    if close:
        print(f"AUTO vs the better fixed policy at each QPS, {args.repeats} repeats pooled, each repeat's range in "
              "brackets (tokens/s ratio: higher is better, 1.00 = as good; "
              "ITL ratios: lower is better, 1.00 = as good):")
        print()
        print(table)
    goodput, slo_close = slo_table(rows)
    slo_noise: list[dict] = []
    if slo_close:
        targets = [f"{name} <= {ms:g} ms" for name, ms in (("TPOT", args.tpot_target_ms), ("TTFT", args.ttft_target_ms))
                   if ms is not None]
        print(f"\nSLO attainment ({', '.join(targets)}) and AUTO vs the better fixed policy by it "
              "(goal: tokens/s >= 0.95x, attainment >= its):\n")
        print(goodput)
        spread, slo_noise = slo_spread(rows, repeats)
        if spread:
            print(f"\nHow far it can be trusted: attainment over the {args.repeats} repeats, and AUTO's gap to the "
                  "better fixed policy paired within each repeat (verdict: met / within noise / missed):\n")
            print(spread)
        effect = target_effect(rows, repeats, UNTARGETED)
        if effect:
            print("\nAUTO with the TPOT target against AUTO without it (judged at the same target):\n")
            print(effect)
    lm = config.load_monitor
    override = f"; operator override off above {lm.disable_qps:g} req/s" if lm.disable_qps is not None else ""
    sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}"
    pair = f"emulated {args.profile} x{args.time_scale:g}" if args.profile else "bundled pair"
    title = (f"{pair}, {sampling}, {args.max_new_tokens} new tokens, {args.num_slots} slots, "
             f"{args.repeats} × {args.duration:g}s (≥ {args.min_requests:g} requests) per point; "
             f"AUTO = goodput plan{override}")
    plot(rows, args.plot, title)
    timeline_path = args.plot.with_name(args.plot.stem + "_timeline.png")
    plot_timeline(rows, timeline_path, args.warmup)
    print(f"\nplots: {args.plot}, {timeline_path}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v)
                                                  for k, v in vars(args).items()},
                                         "rows": rows, "auto_vs_best": close, "slo_vs_best": slo_close,
                                         "slo_spread": slo_noise,
                                         "repeats": [[{k: v for k, v in r.items() if k != "switch_timeline"}
                                                      for r in rep]
                                                     for rep in repeats]}, indent=2))
        print(f"rows: {args.json}")


if __name__ == "__main__":
    main()
