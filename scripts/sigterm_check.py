"""`kill -TERM` of `specdec serve` while placing, while idle and under streams: the exit
status, how long it took, what each in-flight stream saw, and which of its processes
(the PID tree, collected while it ran) are still alive afterwards.

    python scripts/sigterm_check.py --phase streams --streams 8 --runs 10

A stream's outcome: "finished" (its last chunk / [DONE]), "unavailable" (gRPC UNAVAILABLE,
or an SSE error event of type service_unavailable_error), or anything else (a failure of
the check: a silent cut, INTERNAL, ...).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import grpc
import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specdec.wiring.ports import free_port  # noqa: E402
from specdec_rpc.public.client import SpecdecClient  # noqa: E402

PHASES = ("placing", "idle", "streams")
PROMPT = "def parse(line):"


@dataclass
class Run:
    phase: str
    exit_code: int | None = None
    exit_s: float = 0.0
    outcomes: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    tree: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.left and all(o in ("finished", "unavailable") for o in self.outcomes)


def start_server(grace_s: float, workdir: str) -> tuple[subprocess.Popen, int, int]:
    port, http_port = free_port(), free_port()
    config = os.path.join(workdir, "grace.yaml")
    with open(config, "w") as f:
        f.write(f"serving:\n  shutdown_grace_s: {grace_s}\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--port", str(port), "--http-port", str(http_port),
         "--config", config],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])},
    )
    return process, port, http_port


def wait_for(process: subprocess.Popen, stream, needle: str, timeout_s: float) -> str:
    """The first line of `stream` containing `needle` (AssertionError on timeout or exit)."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if selector.select(timeout=0.5):
            line = stream.readline()
            if needle in line:
                return line
    raise AssertionError(f"no line with {needle!r} within {timeout_s}s (exit status {process.poll()})")


def tree(process: subprocess.Popen) -> dict[int, str]:
    """The server's process tree now: pid -> command line."""
    try:
        root = psutil.Process(process.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for p in procs:
        try:
            found[p.pid] = " ".join(p.cmdline())[:100]
        except psutil.Error:
            pass
    return found


def alive(pids: dict[int, str], settle_s: float) -> list[str]:
    deadline = time.monotonic() + settle_s
    while True:
        left = []
        for pid, cmd in pids.items():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid} {cmd}")
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def grpc_stream(port: int, tokens: int, started: threading.Event, out: list[str]) -> None:
    try:
        with SpecdecClient(f"127.0.0.1:{port}", timeout_s=300, retries=0) as client:
            for chunk in client.generate_stream(PROMPT, max_new_tokens=tokens):
                started.set()
                if chunk.finish_reason:
                    out.append("finished")
                    return
        out.append("cut: no final chunk")
    except grpc.RpcError as exc:
        unavailable = exc.code() == grpc.StatusCode.UNAVAILABLE
        out.append("unavailable" if unavailable else f"{exc.code().name}: {exc.details()}")
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
    finally:
        started.set()


def sse_stream(http_port: int, tokens: int, started: threading.Event, out: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=300)
    body = {"prompt": PROMPT, "max_tokens": tokens, "stream": True}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            out.append(f"HTTP {response.status} {response.read()[:200]!r}")
            return
        while True:
            line = response.readline()
            if not line:
                out.append("cut: no [DONE]")
                return
            started.set()
            if line.startswith(b"data: [DONE]"):
                out.append("finished")
                return
            event = json.loads(line[6:]) if line.startswith(b"data: {") else {}
            if "error" in event:  # (a token's text may say "error" too: only the event's key counts)
                error = event["error"]
                out.append("unavailable" if error.get("type") == "service_unavailable_error" else f"SSE {error}")
                return
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
    finally:
        started.set()
        conn.close()


def open_streams(port: int, http_port: int, count: int, tokens: int) -> tuple[list[threading.Thread], list[str]]:
    """`count` streams, half gRPC and half SSE, each started (a first token received)."""
    out: list[str] = []
    threads = []
    for i in range(count):
        started = threading.Event()
        target = grpc_stream if i % 2 == 0 else sse_stream
        t = threading.Thread(target=target, args=(port if i % 2 == 0 else http_port, tokens, started, out), daemon=True)
        t.start()
        threads.append(t)
        started.wait(120)
    return threads, out


def one_run(phase: str, streams: int, tokens: int, grace_s: float, timeout_s: float = 300) -> Run:
    run = Run(phase)
    with tempfile.TemporaryDirectory() as workdir:
        process, port, http_port = start_server(grace_s, workdir)
        pids: dict[int, str] = {}
        try:
            threads: list[threading.Thread] = []
            if phase == "placing":
                wait_for(process, process.stderr, "placing and loading the target", timeout_s)
                time.sleep(1.0)
            else:
                wait_for(process, process.stdout, "specdec serving on", timeout_s)
                if phase == "streams":
                    threads, run.outcomes = open_streams(port, http_port, streams, tokens)
            pids = tree(process)
            run.tree = len(pids)
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            run.exit_code = process.wait(timeout=grace_s + 60)
            run.exit_s = time.monotonic() - sent
            for t in threads:
                t.join(30)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        run.left = alive(pids, settle_s=10.0)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=PHASES, action="append", help="default: all three")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=400, help="max_new_tokens of each stream")
    parser.add_argument("--grace", type=float, default=20.0, help="serving.shutdown_grace_s")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        for phase in args.phase or PHASES:
            run = one_run(phase, args.streams, args.tokens, args.grace)
            runs.append(run)
            counts = {o: run.outcomes.count(o) for o in sorted(set(run.outcomes))}
            print(f"run {i + 1} {phase:8s} exit {run.exit_code} in {run.exit_s:5.1f}s  streams {counts}  "
                  f"tree {run.tree} left {len(run.left)} {run.left[:3]}  {'OK' if run.ok else 'FAIL'}", flush=True)
    failed = [r for r in runs if not r.ok]
    print(f"{len(runs) - len(failed)} of {len(runs)} runs OK; longest exit {max(r.exit_s for r in runs):.1f}s "
          f"(grace {args.grace:g}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
