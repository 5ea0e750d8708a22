"""Do the workers answer anyone but the router? Direct worker calls from a process without
the internal secret, while public requests run.

Starts `specdec serve` (its defaults: it generates the internal secret and binds the workers
to loopback; this process strips SPECDEC_INTERNAL_SECRET from its own environment and never
learns the generated one), records each prompt's greedy output once over the public API, finds
the workers' ports among the listening sockets of the server's process tree (psutil), then
makes `--calls` direct calls to them: GetInfo, KeepAlive, Propose and Verify under a made-up
lease (the Verify calls would each take a target slot), spread over the ports, while a client
keeps sending the prompts over the public API. Prints what the workers answered (a call that
reached a handler is "accepted": anything but UNAUTHENTICATED), which interfaces they listen
on, and how many public requests returned their reference output.

    python scripts/worker_intruder.py [--calls 1000] [--max-new-tokens 16]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402
import psutil  # noqa: E402

from specdec_rpc.worker.internal_auth import SECRET_ENV  # noqa: E402
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402

PROMPTS = ["def parse(line):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):"]
MADE_UP_LEASE = "intruder-lease"


def _verify(channel: grpc.Channel, n: int) -> None:
    history = worker_pb2.HistoryDelta(seq_id=f"intruder-{n}", offset=0, token_ids=[1, 2, 3])
    request = worker_pb2.VerifyRequest(items=[worker_pb2.VerifyItem(history=history)], lease_id=MADE_UP_LEASE)
    worker_pb2_grpc.TargetWorkerStub(channel).Verify(request, timeout=5)


def _propose(channel: grpc.Channel, n: int) -> None:
    history = worker_pb2.HistoryDelta(seq_id=f"intruder-{n}", offset=0, token_ids=[1, 2, 3])
    request = worker_pb2.ProposeRequest(sequences=[history], gammas=[4], lease_id=MADE_UP_LEASE)
    worker_pb2_grpc.DraftWorkerStub(channel).Propose(request, timeout=5)


STUBS = {"target": worker_pb2_grpc.TargetWorkerStub, "draft": worker_pb2_grpc.DraftWorkerStub}


def _info(kind: str):
    def info(channel: grpc.Channel, n: int) -> None:
        STUBS[kind](channel).GetInfo(worker_pb2.InfoRequest(), timeout=5)
    return info


def _keep_alive(kind: str):
    def keep_alive(channel: grpc.Channel, n: int) -> None:
        STUBS[kind](channel).KeepAlive(worker_pb2.KeepAliveRequest(lease_id=MADE_UP_LEASE), timeout=5)
    return keep_alive


#: per kind of worker: (name, call) of the calls an intruder tries (Verify / Propose take slots)
CALLS = {kind: ((work.__name__.strip("_"), work), ("GetInfo", _info(kind)), ("KeepAlive", _keep_alive(kind)))
         for kind, work in (("target", _verify), ("draft", _propose))}


def answer(address: str, call, n: int = 0) -> tuple[str, str]:
    """The status name and details one call without the secret gets ("OK" when served)."""
    with grpc.insecure_channel(address) as channel:
        try:
            call(channel, n)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


def listening(pid: int) -> list[tuple[str, int]]:
    """(ip, port) of every TCP socket listening in the process tree rooted at pid."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    found = set()
    for process in processes:
        try:
            connections = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found.update((c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN)
    return sorted(found)


def dial(ip: str, port: int) -> str:
    """Where to reach a socket listening on ip (a wildcard: loopback)."""
    return f"127.0.0.1:{port}" if ip in ("0.0.0.0", "::") else f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def worker_sockets(pid: int) -> list[tuple[str, int, str]]:
    """(ip, port, kind) of the listening sockets that speak a worker service: GetInfo there is
    answered, or refused for want of the internal secret."""
    workers = []
    for ip, port in listening(pid):
        for kind in STUBS:
            code, details = answer(dial(ip, port), _info(kind))
            if code == "OK" or (code == "UNAUTHENTICATED" and "secret" in details):
                workers.append((ip, port, kind))
    return workers


def intrude(sockets: list[tuple[str, int, str]], calls: int) -> Counter:
    """`calls` direct calls without the secret, spread over the workers and their methods."""
    targets = [(dial(ip, port), name, call) for ip, port, kind in sockets for name, call in CALLS[kind]]
    answers: Counter = Counter()
    for n, (address, name, call) in zip(range(calls), itertools.cycle(targets)):
        answers[f"{name}: {answer(address, call, n)[0]}"] += 1
    return answers


def accepted(answers: Counter) -> int:
    """Calls that reached a handler (anything but a refusal for want of the secret)."""
    return sum(count for key, count in answers.items() if key.rsplit(": ", 1)[1] != "UNAUTHENTICATED")


def start_server(port: int, http_port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    return subprocess.Popen(
        [sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--port", str(port), "--http-port", str(http_port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)


def wait_ready(process: subprocess.Popen, timeout_s: float) -> str:
    """The server's ready line (its only line on stdout); killed when none came within timeout_s."""
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    try:
        line = process.stdout.readline()
    finally:
        timer.cancel()
    if not line.startswith("specdec serving"):
        raise RuntimeError(f"specdec serve was not ready within {timeout_s}s (exit status {process.poll()})")
    return line


class PublicLoad(threading.Thread):
    """Sends the prompts over the public API until stopped; counts outputs that differ."""

    def __init__(self, address: str, reference: dict[str, list[int]], max_new_tokens: int) -> None:
        super().__init__(daemon=True)
        self.address, self.reference, self.max_new_tokens = address, reference, max_new_tokens
        self.sent = self.wrong = 0
        self.failures: Counter = Counter()
        self.stopped = threading.Event()

    def run(self) -> None:
        from specdec_rpc.public.client import SpecdecClient

        with SpecdecClient(self.address, timeout_s=120.0, retries=0) as client:
            for prompt in itertools.cycle(self.reference):
                if self.stopped.is_set():
                    return
                self.sent += 1
                try:
                    ids = list(client.generate(prompt, max_new_tokens=self.max_new_tokens).token_ids)
                except grpc.RpcError as exc:
                    self.failures[exc.code().name] += 1
                    continue
                self.wrong += ids != self.reference[prompt]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="direct worker calls without the secret")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    os.environ.pop(SECRET_ENV, None)
    from specdec.wiring.ports import free_port
    from specdec_rpc.public.client import SpecdecClient

    port, http_port = free_port(), free_port()
    process = start_server(port, http_port)
    try:
        wait_ready(process, args.ready_timeout_s)
        address = f"127.0.0.1:{port}"
        with SpecdecClient(address, timeout_s=120.0, retries=0) as client:
            reference = {p: list(client.generate(p, max_new_tokens=args.max_new_tokens).token_ids) for p in PROMPTS}
        sockets = worker_sockets(process.pid)
        if not sockets:
            print("no worker port found among the server's listening sockets")
            return 1
        load = PublicLoad(address, reference, args.max_new_tokens)
        load.start()
        started = time.monotonic()
        answers = intrude(sockets, args.calls)
        took = time.monotonic() - started
        load.stopped.set()
        load.join(timeout=180)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    print(f"worker sockets: {', '.join(f'{kind} {dial(ip, p)} (bound to {ip})' for ip, p, kind in sockets)}")
    print(f"{sum(answers.values())} direct calls without the secret in {took:.1f}s: {accepted(answers)} accepted")
    for key, count in sorted(answers.items()):
        print(f"  {key:<32} {count}")
    print(f"public requests meanwhile: {load.sent} sent, {load.wrong} wrong output, failures {dict(load.failures)}")
    return 0 if accepted(answers) == 0 and load.wrong == 0 and not load.failures else 1


if __name__ == "__main__":
    sys.exit(main())
