"""Where the served stack's CPU goes per round, process by process and thread by thread (emulated devices).

Starts `specdec serve`'s stack as `bench_serving.py --profile` does (draft worker and target
group as Ray actors, the router behind Serve with `serving.ingress: direct`, sequential rounds)
and streams the bundled prompts through the router replica's own port, N streams at a time.
Around each row it reads, for every thread of every process of the stack (this driver, the
client, included), the kernel's scheduler counters (`/proc/PID/task/TID/schedstat`: time on a
CPU, time waiting for one; `status`: voluntary and involuntary context switches), and prints
per round: CPU ms, run-queue wait ms (ready but no core free: the machine's share) and wake-ups
(voluntary switches), per process and for its busiest threads. A thread that wakes every round
with nothing to do for the round shows up as wake-ups without CPU.

Usage: python benchmarks/served_threads.py [--profile h100-llama-8b-1b] [--streams 1 8 32]
    [--prompts 4] [--max-new-tokens 96] [--runs 1] [--top 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
from collections import defaultdict

from emulated_serving import emulated_overrides, prompts_for


def process_name(process) -> str:
    """A short name: Ray's process title (ray::Class), else the executable's."""
    try:
        cmd = process.cmdline()
    except Exception:  # noqa: BLE001 - ended meanwhile
        return "?"
    title = cmd[0] if cmd else process.name()
    if title.startswith("ray::"):
        return title.split()[0]
    return os.path.basename(title) if not title.endswith("python") else " ".join(os.path.basename(c) for c in cmd[:2])


def thread_counters(pid: int) -> dict[int, tuple[str, float, float, int, int]]:
    """{tid: (name, cpu s, run-queue wait s, voluntary, involuntary switches)} of a process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                run_ns, wait_ns, _ = (int(x) for x in f.read().split())
            with open(f"{base}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        out[int(tid)] = (name, run_ns / 1e9, wait_ns / 1e9, int(fields["voluntary_ctxt_switches"]),
                         int(fields["nonvoluntary_ctxt_switches"]))
    return out


def python_threads(pid: int) -> dict[int, str]:
    """{tid: 'thread name: innermost frame'} of a Python process's threads (py-spy dump;
    threads that never ran Python, e.g. gRPC's and Ray's C++ threads, are not listed)."""
    import subprocess

    try:
        text = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found, lines = {}, text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r'Thread (\d+) \((\w+)\): "(.*)"', line)
        if m:
            frame = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].startswith("Thread") else ""
            found[int(m.group(1))] = f"{m.group(3)}: {frame}"
    return found


def record(processes: dict[int, str], folder: str, tag: str) -> list:
    """py-spy record (raw collapsed stacks, every thread, without pausing the process) of the
    watched processes, until SIGINT."""
    import subprocess

    os.makedirs(folder, exist_ok=True)
    spies = []
    for pid, name in processes.items():
        short = next((k for k in WATCHED[:3] if k in name), None)
        if short:
            spies.append(subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "200", "--nonblocking",
                                           "--threads", "--format", "raw", "-o", f"{folder}/{short}-{tag}.txt"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy so far (all processes: /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def stack_processes() -> dict[int, str]:
    """{pid: name} of this driver and every process under it (Ray's, the workers, Serve's)."""
    import psutil

    me = psutil.Process()
    return {p.pid: process_name(p) for p in [me, *me.children(recursive=True)]}


#: the processes whose threads are listed one by one, named by py-spy
WATCHED = ("SpecdecRouter", "DraftWorker", "TargetLeader", "served_threads")


def snapshot(processes: dict[int, str]) -> dict[int, dict]:
    return {pid: thread_counters(pid) for pid in processes}


def thread_deltas(before: dict, after: dict, rounds: int) -> list[dict]:
    """Each thread's CPU ms, run-queue wait ms, wake-ups and preemptions per round between two
    `thread_counters` readings of one process (a thread new since `before` counts from 0)."""
    out = []
    for tid, (name, cpu, wait, vol, invol) in after.items():
        o = before.get(tid, (name, 0.0, 0.0, 0, 0))
        out.append({"tid": tid, "name": name, "cpu_ms": 1000 * (cpu - o[1]) / rounds,
                    "wait_ms": 1000 * (wait - o[2]) / rounds, "wakeups": (vol - o[3]) / rounds,
                    "preempted": (invol - o[4]) / rounds})
    return out


def difference(before: dict, after: dict, processes: dict[int, str], rounds: int, top: int,
               names: dict[int, dict[int, str]]) -> list[dict]:
    """Per process (busiest first): CPU, wait, wake-ups per round, and its `top` threads'."""
    rows = []
    for pid, threads in after.items():
        per_thread = thread_deltas(before.get(pid, {}), threads, rounds)
        total = {k: sum(t[k] for t in per_thread) for k in ("cpu_ms", "wait_ms", "wakeups", "preempted")}
        grouped: dict[str, dict] = defaultdict(lambda: {"cpu_ms": 0.0, "wait_ms": 0.0, "wakeups": 0.0,
                                                        "preempted": 0.0, "threads": 0})
        for t in per_thread:
            g = grouped[t["name"]]
            for k in ("cpu_ms", "wait_ms", "wakeups", "preempted"):
                g[k] += t[k]
            g["threads"] += 1
        busiest = sorted(grouped.items(), key=lambda kv: -(kv[1]["cpu_ms"] + 0.01 * kv[1]["wakeups"]))[:top]
        labels = names.get(pid, {})
        single = sorted(per_thread, key=lambda t: -(t["cpu_ms"] + 0.01 * t["wakeups"]))[:top]
        for t in single:
            t["label"] = labels.get(t["tid"], t["name"])
        rows.append({"pid": pid, "process": processes[pid], **total,
                     "threads": [{"name": n, **g} for n, g in busiest], "busiest": single})
    return sorted(rows, key=lambda r: -r["cpu_ms"])


async def run_level(address: str, prompts: list[str], max_new: int, streams: int) -> int:
    from specdec_rpc.public.client import AsyncSpecdecClient

    queue = list(prompts)
    tokens = 0
    async with AsyncSpecdecClient(address, timeout_s=600.0) as client:
        async def worker() -> None:
            nonlocal tokens
            while queue:
                async for chunk in client.generate_stream(queue.pop(0), max_new_tokens=max_new, mode="on"):
                    tokens += len(chunk.token_ids)

        await asyncio.gather(*(worker() for _ in range(streams)))
    return tokens


async def profile_of(address: str, app) -> dict:
    """The router's cumulative round profile and the emulated devices' busy time (as
    bench_serving reads them: framework ms per round = round time - device time)."""
    from bench_serving import PROFILE_PARTS
    from emulated_serving import device_totals
    from specdec_rpc.public.client import AsyncSpecdecClient

    async with AsyncSpecdecClient(address, timeout_s=60.0) as client:
        p = (await client.stats()).round_profile
    devices = await app.hub.emulated_devices.remote()
    return {"rounds": p.rounds, **{part: getattr(p, part) for part in PROFILE_PARTS},
            **device_totals([d for found in devices.values() for d in found])}


def show(rows: list[dict], streams: int, rounds: int, wall_s: float) -> None:
    if rounds:
        print(f"\n{streams} streams: {rounds} rounds, {1000 * wall_s / rounds:.2f} ms per round "
              f"(per round: CPU ms, run-queue wait ms, wake-ups, preemptions)")
    for r in rows:
        if r["cpu_ms"] < 0.02 and r["wakeups"] < 0.05:
            continue
        print(f"  {r['process'][:44]:44s} cpu {r['cpu_ms']:6.2f}  wait {r['wait_ms']:5.2f}  "
              f"wake {r['wakeups']:5.1f}  pre {r['preempted']:4.1f}")
        for t in r["threads"]:
            if t["cpu_ms"] >= 0.02 or t["wakeups"] >= 0.1:
                print(f"      {t['name'][:24]:24s} x{t['threads']:<3d} cpu {t['cpu_ms']:6.2f}  wait {t['wait_ms']:5.2f}"
                      f"  wake {t['wakeups']:5.1f}  pre {t['preempted']:4.1f}")
        if any(key in r["process"] for key in WATCHED):
            for t in r["busiest"]:
                print(f"        tid {t['tid']:<7d} cpu {t['cpu_ms']:6.2f}  wait {t['wait_ms']:5.2f}  wake "
                      f"{t['wakeups']:5.1f}  {t['label'][:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="h100-llama-8b-1b")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--json", default=None)
    parser.add_argument("--seconds", type=float, default=0.0, help="repeat each row's prompts for at least this long")
    parser.add_argument("--idle", type=float, default=0.0, help="first measure the stack this many seconds idle "
                        "(no request: what its background costs, per second)")
    parser.add_argument("--record", default=None, help="py-spy record the router, draft and target processes "
                        "during each row into this folder (raw collapsed stacks, per thread)")
    args = parser.parse_args()
    import time

    import torch

    from actors.app import free_port, start_app
    from bench_serving import profile_delta
    from specdec.config.config import load_config
    from specdec.models.model_paths import bundled_prompts

    torch.set_num_threads(1)
    base = emulated_overrides(args.profile, 1.0, max(args.streams))
    base["serving"].update(port=free_port(), http_port=free_port(), direct_port=free_port(),
                           direct_http_port=free_port())
    base["speculation"] = {"overlap": False}
    app = start_app(load_config(overrides=base), ray_init_kwargs={"include_dashboard": False, "log_to_driver": False})
    address = ",".join(app.direct_addresses)
    results = []
    try:
        prompts = bundled_prompts()[: args.prompts]
        asyncio.run(run_level(address, prompts[:1], 8, 1))  # warm-up
        processes = stack_processes()
        names = {pid: python_threads(pid) for pid, name in processes.items() if any(k in name for k in WATCHED)}
        if args.idle:
            before, busy0 = snapshot(processes), machine_busy_s()
            time.sleep(args.idle)
            after, busy = snapshot(processes), machine_busy_s() - busy0
            rows = difference(before, after, processes, args.idle, args.top, names)
            print(f"\nidle, per second (CPU ms, run-queue wait ms, wake-ups, preemptions); the machine's cores "
                  f"busy {busy / args.idle:.2f}, the stack's CPU {sum(r['cpu_ms'] for r in rows):.0f} ms per s")
            show(rows, 0, 0, 0.0)
            results.append({"idle_s": args.idle, "processes": rows})
        for run in range(1, args.runs + 1):
            for streams in args.streams:
                texts = prompts_for(prompts, streams)
                profile0 = asyncio.run(profile_of(address, app))
                before, start = snapshot(processes), time.perf_counter()
                busy0 = machine_busy_s()
                spies = record(processes, args.record, f"{streams}x{run}") if args.record else []
                tokens = asyncio.run(run_level(address, texts, args.max_new_tokens, streams))
                while time.perf_counter() - start < args.seconds:
                    tokens += asyncio.run(run_level(address, texts, args.max_new_tokens, streams))
                for spy in spies:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
                wall, after, busy = time.perf_counter() - start, snapshot(processes), machine_busy_s() - busy0
                profile = profile_delta(profile0, asyncio.run(profile_of(address, app)))
                rounds = profile.get("rounds", 0)
                print(f"\n{streams} streams: framework {profile.get('framework_ms', 0):.2f} ms per round "
                      f"(round {profile.get('round_ms', 0):.2f}, late {profile.get('late_ms', 0):.2f})")
                rows = difference(before, after, processes, max(1, rounds), args.top, names)
                show(rows, streams, rounds, wall)
                stack_ms = sum(r["cpu_ms"] for r in rows)
                others_ms = 1000 * busy / max(1, rounds) - stack_ms
                print(f"  the stack's CPU {stack_ms:.2f} ms per round, other jobs' {others_ms:.2f} "
                      f"({1000 * busy / wall / 1000:.2f} of the machine's cores busy)")
                results.append({"run": run, "streams": streams, "rounds": rounds, "tokens": tokens, "wall_s": wall,
                                "framework_ms": profile.get("framework_ms"), "round_ms": profile.get("round_ms"),
                                "stack_cpu_ms": stack_ms, "others_cpu_ms": others_ms, "processes": rows})
    finally:
        app.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
