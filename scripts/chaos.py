"""A bounded chaos run against a real server: faults injected while greedy streams run.

Starts `specdec serve`'s stack in-process (local Ray, the worker hub, the Serve router, a
local redis-server as the load store), records each prompt's greedy output once, then for
each fault: runs `--clients` concurrent greedy streams (clients that retry UNAVAILABLE, as
specdec's do: a stream only before its first chunk; their speculation modes cycle through
`--modes`), injects the fault by PID (the actor's process, found in Ray's actor table, or
redis-server): a kill (SIGKILL; Redis is restarted after 3 s) or a hang (SIGSTOP, SIGCONT
after `--hang-s`), and keeps the load on until the server has fully recovered (health
SERVING, a request drafts again, the load monitor reads Redis again) or `--max-recovery-s`
passed. Prints one table row per fault: requests sent / failed / wrong output, failure
codes, each stream's longest token gap during the fault (from the injection to SIGCONT, or
to full recovery after a kill) beside its p99 gap before the fault, and the time to full
recovery (after a hang: from SIGCONT). Bounded: at most `--hang-s` + `--max-recovery-s` +
`--tail-s` per fault, faults run once each.

    python scripts/chaos.py [--tp 2] [--clients 4] [--modes on,auto,off] [--hang-s 5] [--faults draft,draft-hang,...]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

PROMPTS = ["def parse(line):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):",
           "for i in range(10):", "# read the file\nwith open(path) as f:", "def fib(n):"]
FAULTS = ("draft", "draft-hang", "rank", "rank-hang", "leader", "router", "router-hang", "redis-hang", "redis-kill")
# the actor class (suffix) each fault's process belongs to (redis-server is not an actor)
ACTORS = {"draft": "DraftWorkerActor", "rank": "TargetFollower", "leader": "TargetLeader", "router": ":SpecdecRouter"}


@dataclass
class Tally:
    sent: int = 0
    failed: int = 0
    wrong: int = 0
    codes: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, failed_code: str | None, wrong: bool) -> None:
        with self.lock:
            self.sent += 1
            self.failed += failed_code is not None
            self.wrong += wrong
            if failed_code is not None:
                self.codes[failed_code] += 1


def actor_pid(class_suffix: str) -> int:
    from ray._private.state import actors

    pids = [a["Pid"] for a in actors().values() if a["State"] == "ALIVE" and a["ActorClassName"].endswith(class_suffix)]
    if not pids:
        raise RuntimeError(f"no live {class_suffix} actor")
    return pids[0]


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest wait for a token that overlaps [start, end]: between consecutive marks
    (a request sent, or a chunk received) of one stream."""
    return max((b - a for a, b in zip(times, times[1:]) if b > start and a < end), default=0.0)


def p99_gap(times: list[float], before: float) -> float:
    """The p99 of a stream's waits for a token that ended before `before`."""
    gaps = sorted(b - a for a, b in zip(times, times[1:]) if b <= before)
    return gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else 0.0


class Load:
    """`clients` threads, each streaming greedy requests in a loop (speculation mode
    `modes[i % len(modes)]`), checking the output and marking when each token came."""

    def __init__(self, address: str, reference: dict[str, list[int]], clients: int, max_new: int,
                 modes: list[str]) -> None:
        self.address, self.reference, self.max_new = address, reference, max_new
        self.tally = Tally()
        self.modes = [modes[i % len(modes)] for i in range(clients)]
        self.marks: list[list[float]] = [[] for _ in range(clients)]  # per stream: requests sent, chunks received
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _run(self, worker: int) -> None:
        import grpc

        from specdec_rpc.public.client import SpecdecClient

        # a real client: UNAVAILABLE is retried (a stream only before its first chunk)
        with SpecdecClient(self.address, timeout_s=120.0, retries=6, backoff_s=0.5) as client:
            i, marks = worker, self.marks[worker]
            while not self._stop.is_set():
                prompt = PROMPTS[i % len(PROMPTS)]
                i += 1
                try:
                    marks.append(time.monotonic())
                    ids = []
                    for chunk in client.generate_stream(prompt, max_new_tokens=self.max_new, mode=self.modes[worker]):
                        marks.append(time.monotonic())
                        ids.extend(chunk.token_ids)
                    self.tally.add(None, ids != self.reference[prompt])
                except grpc.RpcError as exc:
                    self.tally.add(exc.code().name, False)
                    time.sleep(0.2)


def recovered(client, redis_check: bool) -> bool:
    """Fully recovered: SERVING, speculation on (a request drafts), and the load store shared."""
    try:
        if client.health() != "SERVING":
            return False
        response = client.generate(PROMPTS[0], max_new_tokens=8, mode="on")
        stats = client.stats()
    except Exception:  # noqa: BLE001 - not yet
        return False
    return response.stats.drafted > 0 and (not redis_check or stats.measurements_source == "shared")


def inject(fault: str, redis, hang_s: float) -> None:
    """Inject one fault; a hang (SIGSTOP) ends with SIGCONT after hang_s, whatever happens
    meanwhile; redis-kill restarts redis-server after 3 s."""
    if fault == "redis-kill":
        redis.stop()
        time.sleep(3.0)
        # the same port, so the routers reconnect; started from this (main) thread: the
        # child's parent-death signal fires when the thread that started it ends
        redis.start()
        return
    target = fault.removesuffix("-hang")
    pid = redis.process.pid if target == "redis" else actor_pid(ACTORS[target])
    if not fault.endswith("-hang"):
        os.kill(pid, signal.SIGKILL)
        return
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(hang_s)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed meanwhile (a hung target rank is taken for dead)


@dataclass
class FaultRun:
    """One fault's outcome: the requests' tally, each stream's mode, longest token gap during
    the fault and p99 gap before it, and the time to full recovery (None: not within the limit)."""

    tally: Tally
    modes: list[str]
    gaps: list[float]
    p99_before: list[float]
    recovery: float | None


def run_fault(fault: str, address: str, reference, redis, args) -> FaultRun:
    from specdec_rpc.public.client import SpecdecClient

    with SpecdecClient(address, timeout_s=120.0, retries=3, backoff_s=0.5) as probe, \
            Load(address, reference, args.clients, args.max_new_tokens, args.modes.split(",")) as load:
        time.sleep(args.warm_s)
        injected = time.monotonic()
        inject(fault, redis, args.hang_s)
        start = time.monotonic()  # recovery counts from here: the SIGCONT of a hang
        time.sleep(1.0)  # let the fault take effect before asking whether it is over
        recovery = None
        while time.monotonic() - start < args.max_recovery_s:
            if recovered(probe, redis_check=fault.startswith("redis")):
                recovery = time.monotonic() - start
                break
            time.sleep(0.5)
        end = start if fault.endswith("-hang") else time.monotonic()
        time.sleep(args.tail_s)
    gaps = [longest_gap(marks, injected, end) for marks in load.marks]
    return FaultRun(load.tally, load.modes, gaps, [p99_gap(m, injected) for m in load.marks], recovery)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2, help="target tensor-parallel size")
    p.add_argument("--clients", type=int, default=4, help="concurrent greedy streams")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--modes", default="on,auto,off", help="the streams' speculation modes, in turn (on, auto, off)")
    p.add_argument("--hang-s", type=float, default=5.0, help="how long a hang (SIGSTOP) lasts, seconds")
    p.add_argument("--warm-s", type=float, default=3.0, help="load before each fault, seconds")
    p.add_argument("--tail-s", type=float, default=3.0, help="load after recovery, seconds")
    p.add_argument("--max-recovery-s", type=float, default=90.0, help="give up waiting for recovery after, seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    bad_modes = sorted(set(args.modes.split(",")) - {"on", "auto", "off"})
    if unknown or bad_modes:
        raise SystemExit(f"unknown faults {unknown}" if unknown else f"unknown modes {bad_modes}")
    if args.tp < 2 and any(f.startswith("rank") for f in faults):
        raise SystemExit("the rank faults need --tp >= 2")
    from actors.app import free_port, start_app
    from specdec_redis.local_redis import LocalRedis
    from specdec.config.config import load_config
    from specdec_rpc.public.client import SpecdecClient

    redis = LocalRedis().start()
    config = load_config(overrides={
        "cache": {"num_slots": 16, "max_seq_len": 256},
        "serving": {"port": free_port(), "http_port": free_port(), "tensor_parallel_size": args.tp,
                    "distributed_backend": "gloo", "worker_timeout_s": 10.0, "lease_ttl_s": 2.0},
        "load_monitor": {"redis_url": redis.url},
    })
    app = start_app(config, ray_init_kwargs={"num_cpus": args.tp + 2, "include_dashboard": False,
                                             "log_to_driver": False})
    rows = []
    try:
        with SpecdecClient(app.address, timeout_s=120.0) as client:
            reference = {p: list(client.generate(p, max_new_tokens=args.max_new_tokens).token_ids) for p in PROMPTS}
        for fault in faults:
            run = run_fault(fault, app.address, reference, redis, args)
            rows.append((fault, run))
            print(f"{fault}: sent {run.tally.sent}, failed {run.tally.failed} {dict(run.tally.codes)}, "
                  f"wrong {run.tally.wrong}, gaps {['%.2f' % g for g in run.gaps]}, "
                  f"recovered {'-' if run.recovery is None else f'{run.recovery:.1f}s'}", file=sys.stderr, flush=True)
    finally:
        app.shutdown()
        redis.stop()
    print_table(rows, args)
    return 0 if all(run.tally.wrong == 0 for _, run in rows) else 1


def print_table(rows: list[tuple[str, FaultRun]], args: argparse.Namespace) -> None:
    """One markdown row per fault; the gaps as `mode gap (p99 before)` per stream."""
    print("| fault | requests sent | failed | wrong output | failure codes "
          "| longest token gap during the fault, per stream (p99 gap before) | time to full recovery |")
    print("|---|---:|---:|---:|---|---|---:|")
    for fault, run in rows:
        t = run.tally
        codes = ", ".join(f"{k} {v}" for k, v in t.codes.items()) or "-"
        gaps = ", ".join(f"{m} {g:.2f} s ({p:.2f})" for m, g, p in zip(run.modes, run.gaps, run.p99_before))
        hang = f" {args.hang_s:g} s" if fault.endswith("-hang") else ""
        after = " after SIGCONT" if hang else ""
        time_s = f"{run.recovery:.1f} s{after}" if run.recovery is not None else f"> {args.max_recovery_s:.0f} s"
        print(f"| {fault}{hang} | {t.sent} | {t.failed} | {t.wrong} | {codes} | {gaps} | {time_s} |")


if __name__ == "__main__":
    sys.exit(main())
