"""bench_serving on emulated devices (`bench_serving.py --profile NAME`): the in-process engine
and the served stack (router behind Serve's gRPC proxy, draft and target workers as Ray actors)
on the same emulated devices (configs/devices/NAME.yaml), side by side in one run. The stack
runs with `serving.ingress: direct`, so every served row is measured twice, interleaved:
through Serve's proxy ("server, ...") and through the router replica's own port ("server
direct, ...", which skips the proxy process); the goal ratios are printed for both paths.

The device time of the rounds a row ran is read from the emulated devices themselves (their
busy-time counters: `process_devices()` in this process, `WorkerHub.emulated_devices` for the
workers), so the framework cost per round is what the round took beyond the devices:

    framework = round time − (target device time + the draft device time not hidden behind the verify)

(per round, means over a row's rounds; the tables show the median over the runs). Sequential
rounds hide nothing; with drafting ahead the draft's time spent while the target verified
(the round profile's overlapped time) is off the critical path. "late" is how much later than
their device time forwards returned (the host's wake-up delays on a busy CPU): part of the
framework cost.

`--streams-at-once N` runs N concurrent streams through one router instead (errors must be 0),
through the proxy and then through the router's own port, and reports the router process's and
the proxy's CPU time per generated token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

#: per-round figures (ms) a row's profile carries on emulated devices
DEVICE_PARTS = ("draft_device_ms", "target_device_ms", "late_ms", "critical_device_ms", "framework_ms")
SEQUENTIAL, AHEAD, OFF = "server, speculation on", "server, drafting ahead, speculation on", "server, speculation off"
#: the same setups through the router replicas' own ports (serving.ingress direct), not Serve's proxy
DIRECT = {setup: setup.replace("server", "server direct", 1) for setup in (SEQUENTIAL, AHEAD, OFF)}


def device_totals(devices: list[dict]) -> dict:
    """Cumulative busy and late milliseconds of the draft's and the target's emulated devices
    (listed as process_devices() does; {} when nothing is emulated)."""
    if not devices:
        return {}
    busy = {role: 1000 * sum(d["busy_s"] for d in devices if d["name"].endswith(f":{role}"))
            for role in ("draft", "target")}
    return {"draft_device_total_ms": busy["draft"], "target_device_total_ms": busy["target"],
            "late_total_ms": 1000 * sum(d["late_s"] for d in devices)}


def critical_device_ms(draft_ms: float, target_ms: float, overlapped_ms: float) -> float:
    """Device time on a round's critical path: the verify, and the drafting that did not run
    while the target verified."""
    return target_ms + max(0.0, draft_ms - overlapped_ms)


def device_delta(before: dict, after: dict, delta: dict) -> dict:
    """Per-round device times and framework cost (ms) between two cumulative readings, given the
    round profile's per-round means `delta` over the same rounds ({} without emulated devices)."""
    if "target_device_total_ms" not in after or not delta.get("rounds"):
        return {}
    per_round = {part: (after[f"{part}_total_ms"] - before.get(f"{part}_total_ms", 0.0)) / delta["rounds"]
                 for part in ("draft_device", "target_device", "late")}
    critical = critical_device_ms(per_round["draft_device"], per_round["target_device"],
                                  delta.get("overlapped_ms", 0.0))
    return {"draft_device_ms": per_round["draft_device"], "target_device_ms": per_round["target_device"],
            "late_ms": per_round["late"], "critical_device_ms": critical,
            "framework_ms": delta["round_ms"] - critical}


def prompts_for(prompts: list[str], streams: int) -> list[str]:
    """At least one prompt per stream (the given ones, repeated in turn)."""
    return [prompts[i % len(prompts)] for i in range(max(len(prompts), streams))]


def emulated_overrides(profile: str, time_scale: float, streams: int) -> dict:
    """Config overrides that serve `profile`'s emulated pair for up to `streams` concurrent requests,
    the served target sharded over as many ranks as the profile was fitted at (the in-process
    engine runs the whole group as one device)."""
    from specdec.models.emulated_profile import load_profile

    ranks = load_profile(profile).target.tensor_parallel_size
    return {
        "models": {"target": f"emulated:{profile}:target", "draft": f"emulated:{profile}:draft",
                   "device_time_scale": time_scale},
        "cache": {"num_slots": streams + 8, "max_seq_len": 1024},  # + free draft slots for look-ahead branches
        # both paths, side by side; an emulated rank waits out its device time, so the ranks share a CPU
        "serving": {"max_concurrent_requests": max(streams, 64), "ingress": "direct",
                    "tensor_parallel_size": ranks, "target_num_cpus": 1.0 / ranks},
    }


def paired(rows: list[dict], setup: str, over: str) -> float:
    """Median over runs of setup's tokens/s over `over`'s, measured in the same run at the same streams."""
    index = {(r["run"], r["streams"]): r["tokens_per_s"] for r in rows if r["setup"] == over}
    found = [r["tokens_per_s"] / index[(r["run"], r["streams"])] for r in rows
             if r["setup"] == setup and (r["run"], r["streams"]) in index]
    return statistics.median(found) if found else float("nan")


def goals(rows: list[dict], levels: list[int], predicted: float) -> list[dict]:
    """Per path (through Serve's proxy, through the replicas' own ports) and streams: served
    sequential / in-process, drafting ahead / in-process and / served sequential (medians over
    runs of paired ratios); ON / OFF served vs the prediction (the goal's at 1 stream)."""
    out = []
    for path, names in (("proxy", {s: s for s in (SEQUENTIAL, AHEAD, OFF)}), ("direct", DIRECT)):
        for level in levels:
            at = [r for r in rows if r["streams"] == level]
            if not any(r["setup"] == names[SEQUENTIAL] for r in at):
                continue
            out.append({"path": path, "streams": level,
                        "served_over_in_process": paired(at, names[SEQUENTIAL], "in-process"),
                        "ahead_over_in_process": paired(at, names[AHEAD], "in-process"),
                        "ahead_over_served": paired(at, names[AHEAD], names[SEQUENTIAL]),
                        "on_over_off": paired(at, names[SEQUENTIAL], names[OFF]), "predicted_on_over_off": predicted})
    return out


def table(medians: list[dict], found: list[dict]) -> str:
    lines = ["| setup | streams | tokens/s | round ms | device ms on the critical path | framework ms/round "
             "| of which late | draft device ms | target device ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in medians:
        p = r.get("profile") or {}
        if "framework_ms" in p:
            lines.append(f"| {r['setup']} | {r['streams']} | {r['tokens_per_s']:.1f} | {p['round_ms']:.2f} "
                         f"| {p['critical_device_ms']:.2f} | {p['framework_ms']:.2f} | {p['late_ms']:.2f} "
                         f"| {p['draft_device_ms']:.2f} | {p['target_device_ms']:.2f} |")
    lines += ["", "| path | streams | served sequential / in-process | drafting ahead / in-process "
              "| drafting ahead / served sequential | served ON / OFF | predicted ON / OFF |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for g in found:
        lines.append(f"| {g['path']} | {g['streams']} | {g['served_over_in_process']:.2f} "
                     f"| {g['ahead_over_in_process']:.2f} "
                     f"| {g['ahead_over_served']:.2f} | {g['on_over_off']:.2f} | {g['predicted_on_over_off']:.2f} |")
    return "\n".join(lines)


def prediction(profile_name: str, gamma: int, context: int) -> tuple[float, float, float]:
    """(α, c, predicted ON / OFF speedup) at one stream for the profile."""
    from bench_core import theoretical_speedup
    from specdec.models.emulated_profile import load_profile

    profile = load_profile(profile_name)
    c = profile.draft.latency.forward_ms(1, 1, context) / profile.target.latency.forward_ms(1, 1, context)
    alpha = profile.language.acceptance
    return alpha, c, theoretical_speedup(alpha, gamma, c)


def run(args: argparse.Namespace, bench: Any) -> None:
    """The side-by-side tables on `args.profile` (bench: the bench_serving module)."""
    from progress import Progress
    from specdec.config.config import load_config
    from specdec.models.model_paths import bundled_prompts

    base = emulated_overrides(args.profile, args.time_scale, max(args.concurrency))
    prompts = bundled_prompts()[: args.prompts]
    stacks = [("server", {"overlap": False}, ("on", "off")),
              ("server, drafting ahead", {"overlap": True}, ("on",))]
    reference = bench.InProcess(load_config(*args.config, overrides=base), max(args.concurrency))
    try:
        with Progress(len(stacks) * args.runs * len(args.concurrency), "bench_serving --profile") as progress:
            rows = []
            for label, speculation, modes in stacks:
                config = load_config(*args.config, overrides={**base, "speculation": speculation})
                rows += bench.server_runs(config, reference, prompts, args.max_new_tokens, args.concurrency, label,
                                          progress, modes, args.runs)
        context = statistics.mean(len(reference.built.encode(p)) for p in prompts) + args.max_new_tokens // 2
    finally:
        reference.close()
    gamma = load_config(*args.config, overrides=base).speculation.gamma
    alpha, c, predicted = prediction(args.profile, gamma, context)
    medians, found = bench.summary(rows), goals(rows, args.concurrency, predicted)
    print(f"\nemulated devices (profile {args.profile}), device times x{args.time_scale}; α {alpha}, γ {gamma}, "
          f"c {c:.3f}; greedy, {args.max_new_tokens} new tokens per request; medians of {args.runs} runs\n")
    print(table(medians, found))
    out = args.json or f"benchmarks/results/bench_serving_emulated_{args.profile}.json"
    with open(out, "w") as f:
        json.dump({"profile": args.profile, "time_scale": args.time_scale, "alpha": alpha, "gamma": gamma, "c": c,
                   "runs": rows, "medians": medians, "goals": found}, f, indent=2)


def router_processes(kind: str = "SpecdecRouter") -> list:
    """The Serve router replica processes under this driver (their process title names the
    class; `kind` "ProxyActor": Serve's proxy)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True)
            if kind in " ".join(_cmdline(p))]


def _cmdline(process: Any) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # noqa: BLE001 - a process that ended meanwhile
        return []


def cpu_seconds(processes: list) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def many_streams(args: argparse.Namespace) -> None:
    """`args.streams_at_once` concurrent streams through one router (drafting ahead, the default),
    `args.runs` times through Serve's proxy and through the router replica's own port
    (serving.ingress direct), the paths' order alternating by run: errors, tokens, and the CPU
    time per generated token of the router process and of the proxy's, per run and path."""
    from actors.app import free_port, start_app
    from specdec.config.config import load_config

    n = args.streams_at_once
    base = emulated_overrides(args.profile, args.time_scale, n)
    base["serving"].update(port=free_port(), http_port=free_port(), direct_port=free_port(),
                           direct_http_port=free_port())
    app = start_app(load_config(*args.config, overrides=base),
                    ray_init_kwargs={"include_dashboard": False, "log_to_driver": False})
    try:
        routers = router_processes()
        runs = _many_runs(app, args, routers, router_processes("ProxyActor"))
    finally:
        app.shutdown()
    result = {"profile": args.profile, "streams": n, "max_new_tokens": args.max_new_tokens,
              "router_processes": len(routers), **runs}
    print(json.dumps(result, indent=2))
    out = args.json or f"benchmarks/results/bench_serving_emulated_{args.profile}_{n}_streams.json"
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


def _many_runs(app: Any, args: argparse.Namespace, routers: list, proxies: list) -> dict[str, list[dict]]:
    """{path: [one dict per run]} for "proxy" and (with direct addresses) "direct"."""
    from specdec.models.model_paths import bundled_prompts
    from specdec_rpc.public.client import AsyncSpecdecClient

    prompts = prompts_for(bundled_prompts(), args.streams_at_once)[: args.streams_at_once]
    paths = {"proxy": app.address, **({"direct": ",".join(app.direct_addresses)} if app.direct_addresses else {})}
    runs: dict[str, list[dict]] = {path: [] for path in paths}
    for run in range(1, args.runs + 1):
        for path in list(paths)[:: 1 if run % 2 else -1]:
            row = asyncio.run(_many(paths[path], prompts, args.max_new_tokens, routers, proxies, AsyncSpecdecClient))
            runs[path].append(row)
            print(f"  run {run}, {path}: {row['errors']} errors, {row['tokens_per_s']:.0f} tokens/s, CPU ms per "
                  f"token: router {row['router_cpu_ms_per_token']:.3f}, proxy {row['proxy_cpu_ms_per_token']:.3f}",
                  flush=True)
    return runs


async def _many(address: str, prompts: list[str], max_new: int, routers: list, proxies: list,
                client_class: Any) -> dict:
    errors: list[str] = []
    async with client_class(address, timeout_s=600.0) as client:
        async def one(prompt: str) -> int:
            try:
                return sum([len(c.token_ids) async for c in client.generate_stream(prompt, max_new_tokens=max_new,
                                                                                   mode="on")])
            except Exception as exc:  # noqa: BLE001 - counted: the run must have none
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return 0

        cpu, proxy_cpu, start = cpu_seconds(routers), cpu_seconds(proxies), time.perf_counter()
        tokens = await asyncio.gather(*(one(p) for p in prompts))
        wall, cpu, proxy_cpu = time.perf_counter() - start, cpu_seconds(routers) - cpu, cpu_seconds(proxies) - proxy_cpu
    total = sum(tokens)
    per_token = lambda seconds: 1000 * seconds / total if total else float("nan")  # noqa: E731
    return {"errors": len(errors), "error_samples": errors[:5], "short_streams": sum(t < max_new for t in tokens),
            "tokens": total, "wall_s": wall, "tokens_per_s": total / wall, "router_cpu_s": cpu,
            "router_cpu_ms_per_token": per_token(cpu), "proxy_cpu_ms_per_token": per_token(proxy_cpu)}
