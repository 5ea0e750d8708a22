"""A bounded chaos run against a real server: faults injected while greedy streams run.

Starts `specdec serve`'s stack in-process (local Ray, the worker hub, the Serve router, a
local redis-server as the load store), records each prompt's greedy output once, then for
each fault: runs `--clients` concurrent greedy streams (clients that retry UNAVAILABLE, as
specdec's do: a stream only before its first chunk), injects the fault (SIGKILL by PID of
the actor's process, found in Ray's actor table; SIGSTOP/SIGCONT or SIGKILL of redis-server),
and keeps the load on until the server has fully recovered (health SERVING, a request
drafts again, the load monitor reads Redis again) or `--max-recovery-s` passed. Prints one
table row per fault: requests sent / failed / wrong output, failure codes, time to full
recovery. Bounded: at most `--max-recovery-s` + `--tail-s` per fault, faults run once each.

    python scripts/chaos.py [--tp 2] [--clients 4] [--max-new-tokens 24] [--faults draft,rank,...]
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
FAULTS = ("draft", "rank", "leader", "router", "redis-hang", "redis-kill")


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


class Load:
    """`clients` threads, each streaming greedy requests in a loop and checking the output."""

    def __init__(self, address: str, reference: dict[str, list[int]], clients: int, max_new: int) -> None:
        self.address, self.reference, self.max_new = address, reference, max_new
        self.tally = Tally()
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

        from specdec_rpc.client import SpecdecClient

        # a real client: UNAVAILABLE is retried (a stream only before its first chunk)
        with SpecdecClient(self.address, timeout_s=120.0, retries=6, backoff_s=0.5) as client:
            i = worker
            while not self._stop.is_set():
                prompt = PROMPTS[i % len(PROMPTS)]
                i += 1
                try:
                    ids = [t for c in client.generate_stream(prompt, max_new_tokens=self.max_new) for t in c.token_ids]
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


def inject(fault: str, redis) -> None:
    """Inject one fault (redis-hang resumes redis-server after 5 s, redis-kill restarts it after 3 s)."""
    if fault == "draft":
        os.kill(actor_pid("DraftWorkerActor"), signal.SIGKILL)
    elif fault == "rank":
        os.kill(actor_pid("TargetFollower"), signal.SIGKILL)
    elif fault == "leader":
        os.kill(actor_pid("TargetLeader"), signal.SIGKILL)
    elif fault == "router":
        os.kill(actor_pid(":SpecdecRouter"), signal.SIGKILL)
    elif fault == "redis-hang":
        pid = redis.process.pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(5.0)
        os.kill(pid, signal.SIGCONT)
    elif fault == "redis-kill":
        redis.stop()
        time.sleep(3.0)
        # the same port, so the routers reconnect; started from this (main) thread: the
        # child's parent-death signal fires when the thread that started it ends
        redis.start()


def run_fault(fault: str, address: str, reference, redis, args) -> tuple[Tally, float | None]:
    from specdec_rpc.client import SpecdecClient

    with SpecdecClient(address, timeout_s=120.0, retries=3, backoff_s=0.5) as probe, \
            Load(address, reference, args.clients, args.max_new_tokens) as load:
        time.sleep(args.warm_s)
        start = time.monotonic()
        inject(fault, redis)
        time.sleep(1.0)  # let the fault take effect before asking whether it is over
        recovery = None
        while time.monotonic() - start < args.max_recovery_s:
            if recovered(probe, redis_check=fault.startswith("redis")):
                recovery = time.monotonic() - start
                break
            time.sleep(0.5)
        time.sleep(args.tail_s)
    return load.tally, recovery


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2, help="target tensor-parallel size")
    p.add_argument("--clients", type=int, default=4, help="concurrent greedy streams")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--warm-s", type=float, default=3.0, help="load before each fault, seconds")
    p.add_argument("--tail-s", type=float, default=3.0, help="load after recovery, seconds")
    p.add_argument("--max-recovery-s", type=float, default=90.0, help="give up waiting for recovery after, seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or (args.tp < 2 and "rank" in faults):
        raise SystemExit(f"unknown faults {unknown}" if unknown else "the 'rank' fault needs --tp >= 2")
    from actors.app import free_port, start_app
    from specdec_redis.local_redis import LocalRedis
    from specdec.config import load_config
    from specdec_rpc.client import SpecdecClient

    redis = LocalRedis().start()
    config = load_config(overrides={
        "cache": {"num_slots": 16, "max_seq_len": 256},
        "serving": {"port": free_port(), "http_port": free_port(), "tensor_parallel_size": args.tp,
                    "distributed_backend": "gloo", "worker_timeout_s": 10.0, "lease_ttl_s": 2.0},
        "load_monitor": {"redis_url": redis.url},
    })
    app = start_app(config, ray_init_kwargs={"num_cpus": args.tp + 2, "include_dashboard": False, "log_to_driver": False})
    rows = []
    try:
        with SpecdecClient(app.address, timeout_s=120.0) as client:
            reference = {p: list(client.generate(p, max_new_tokens=args.max_new_tokens).token_ids) for p in PROMPTS}
        for fault in faults:
            tally, recovery = run_fault(fault, app.address, reference, redis, args)
            rows.append((fault, tally, recovery))
            print(f"{fault}: sent {tally.sent}, failed {tally.failed} {dict(tally.codes)}, wrong {tally.wrong}, "
                  f"recovered {'-' if recovery is None else f'{recovery:.1f}s'}", file=sys.stderr, flush=True)
    finally:
        app.shutdown()
        redis.stop()
    print("| fault | requests sent | failed | wrong output | failure codes | time to full recovery |")
    print("|---|---:|---:|---:|---|---:|")
    for fault, t, recovery in rows:
        codes = ", ".join(f"{k} {v}" for k, v in t.codes.items()) or "-"
        time_s = f"{recovery:.1f} s" if recovery is not None else f"> {args.max_recovery_s:.0f} s"
        print(f"| {fault} | {t.sent} | {t.failed} | {t.wrong} | {codes} | {time_s} |")
    return 0 if all(t.wrong == 0 for _, t, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
