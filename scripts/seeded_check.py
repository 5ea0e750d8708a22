"""Seeded sampled requests give the same text whatever speculation does: speculation OFF on
the in-process engine is the reference; a real `specdec serve` must reproduce it with modes
ON, OFF and AUTO over gRPC (Generate) and HTTP (/v1/completions), a few requests at a time so
batches mix modes, and for seeded ON streams (gRPC GenerateStream and SSE) while the draft
worker is SIGSTOPped for a few seconds.

    PYTHONPATH=$PWD python scripts/seeded_check.py --seeds 40 --max-new 48

Prints a table (path x mode -> identical / total) and exits 1 on any difference (each one
listed with the request and the first token position where it differs).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specdec.wiring.ports import free_port  # noqa: E402
from specdec_rpc.public.client import SpecdecClient  # noqa: E402

PROMPTS = ["def parse(line):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):",
           "# read the file\nwith open(path) as f:"]
MODES = ("on", "off", "auto")


@dataclass(frozen=True)
class Case:
    """One seeded request: seed s uses prompt s % len(PROMPTS); every third uses top_p 0.9;
    a few seeds are above 2**63 (the uint64 range, negative int64 seeds on OpenAI's side)."""

    index: int
    seed: int
    prompt: str
    top_p: float

    @property
    def name(self) -> str:
        return f"seed={self.seed} top_p={self.top_p} prompt={self.prompt!r}"


def cases(count: int) -> list[Case]:
    return [Case(i, (2**63 + i) if i % 10 == 9 else 1000 + i, PROMPTS[i % len(PROMPTS)], 0.9 if i % 3 == 2 else 1.0)
            for i in range(count)]


def reference(all_cases: list[Case], max_new: int) -> tuple[dict[int, tuple[list[int], str]], object]:
    """Speculation OFF on the in-process engine built from the default config: case -> (ids,
    text), and the decoder of every output."""
    from specdec.config.config import load_config
    from specdec.wiring.engine_builder import build_engine, decoder
    from specdec.requests.request import GenerationRequest
    from specdec.sampling.sampling_params import SamplingParams

    built = build_engine(load_config(overrides={"load_monitor": {"enabled": False}}))
    requests = [GenerationRequest(tuple(built.encode(c.prompt)), max_new,
                                  SamplingParams(temperature=1.0, top_p=c.top_p, seed=c.seed), mode="off")
                for c in all_cases]
    results = built.engine.generate(requests)
    assert all(r.stats.drafted == 0 for r in results)
    return {c.index: (list(r.token_ids), r.text) for c, r in zip(all_cases, results)}, decoder(built.tokenizer)


def start_server(workdir: str) -> tuple[subprocess.Popen, int, int]:
    port, http_port = free_port(), free_port()
    log = open(os.path.join(workdir, "serve.log"), "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--port", str(port), "--http-port", str(http_port)],
        stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])},
    )
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            raise RuntimeError(f"specdec serve exited {process.returncode}; see {log.name}")
        if "specdec serving on" in line:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep the pipe drained
            return process, port, http_port
    raise RuntimeError("specdec serve did not start within 400 s")


def stop_server(process: subprocess.Popen) -> int | None:
    """SIGTERM (a drain), then wait; SIGKILL of the group only if it does not exit."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def draft_pid(process: subprocess.Popen) -> int:
    """The draft worker actor's process (title `ray::DraftWorkerActor...`): one under the
    server's process tree if there is one, else any (heavy runs hold a lock: only ours runs)."""
    mine = {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
    found = []
    for p in psutil.process_iter():
        try:
            if " ".join(p.cmdline()).startswith("ray::DraftWorker"):
                found.append(p.pid)
        except psutil.Error:
            pass
    if not found:
        raise RuntimeError("no ray::DraftWorker process")
    return sorted(found, key=lambda pid: pid not in mine)[0]


def grpc_call(port: int, case: Case, mode: str, max_new: int, stream: bool) -> tuple[list[int] | None, str, int]:
    """(token ids, text, drafted tokens) of one gRPC request."""
    fields = dict(max_new_tokens=max_new, temperature=1.0, top_p=case.top_p, seed=case.seed, mode=mode)
    with SpecdecClient(f"127.0.0.1:{port}", timeout_s=300, retries=0) as client:
        if not stream:
            response = client.generate(case.prompt, **fields)
            return list(response.token_ids), response.text, response.stats.drafted
        ids, text, drafted = [], "", 0
        for chunk in client.generate_stream(case.prompt, **fields):
            ids += chunk.token_ids
            text += chunk.text
            drafted += chunk.stats.drafted
        return ids, text, drafted


def http_call(http_port: int, case: Case, mode: str, max_new: int, stream: bool) -> tuple[list[int] | None, str, int]:
    """(None: no ids over HTTP, text, drafted tokens) of one /v1/completions request."""
    body = {"prompt": case.prompt, "max_tokens": max_new, "temperature": 1.0, "top_p": case.top_p,
            "seed": case.seed, "speculation": {"mode": mode}, "stream": stream}
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status} {response.read()[:300]!r}")
        if not stream:
            body = json.loads(response.read())
            return None, body["choices"][0]["text"], body["speculation"]["drafted"]
        text, drafted = "", 0
        for line in response:
            if line.startswith(b"data: [DONE]"):
                return None, text, drafted
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"SSE error {event['error']}")
                text += "".join(choice["text"] for choice in event["choices"])
                drafted += event.get("speculation", {}).get("drafted", 0)
        raise RuntimeError("SSE cut before [DONE]")
    finally:
        conn.close()


def first_difference(ref_ids: list[int], ref_text: str, ids: list[int] | None, text: str, decode) -> str:
    """Where the served output leaves the reference: a token position (ids when the API
    returns them, else the first reference prefix the served text does not start with)."""
    if ids is not None and ids != ref_ids:
        k = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
        return f"token {k}: served {ids[k:k + 4]} vs reference {ref_ids[k:k + 4]} (lengths {len(ids)}/{len(ref_ids)})"
    k = next((i for i in range(1, len(ref_ids) + 1) if not text.startswith(decode(ref_ids[:i]))), len(ref_ids))
    c = next((i for i, (a, b) in enumerate(zip(text, ref_text)) if a != b), min(len(text), len(ref_text)))
    return f"token {k - 1} (char {c}): served {text[c:c + 20]!r} vs reference {ref_text[c:c + 20]!r}"


class Tally:
    """path x mode -> [identical, total], and the differences (with where they start)."""

    def __init__(self, refs: dict[int, tuple[list[int], str]], decode) -> None:
        self.refs, self.decode = refs, decode
        self.counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])  # identical, total, drafted
        self.diffs: list[str] = []
        self.lock = threading.Lock()

    def check(self, path: str, mode: str, case: Case, call) -> None:
        ref_ids, ref_text = self.refs[case.index]
        try:
            ids, text, drafted = call()
            same = text == ref_text and (ids is None or ids == ref_ids)
            why = "" if same else first_difference(ref_ids, ref_text, ids, text, self.decode)
        except Exception as exc:  # a failed request counts as a difference: it returned no text
            same, why, drafted = False, f"failed: {type(exc).__name__}: {str(exc)[:200]}", 0
        with self.lock:
            self.counts[(path, mode)][0] += same
            self.counts[(path, mode)][1] += 1
            self.counts[(path, mode)][2] += drafted
            if not same:
                self.diffs.append(f"{path} mode={mode} {case.name}: {why}")


def mixed_phase(tally: Tally, all_cases: list[Case], ports: tuple[int, int], max_new: int, concurrency: int) -> None:
    """Every case x mode over gRPC and HTTP, shuffled and `concurrency` at a time."""
    jobs = [(api, mode, c) for api in ("grpc", "http") for mode in MODES for c in all_cases]
    random.Random(0).shuffle(jobs)

    def run(job) -> None:
        api, mode, case = job
        if api == "grpc":
            tally.check("grpc", mode, case, partial(grpc_call, ports[0], case, mode, max_new, False))
        else:
            tally.check("http", mode, case, partial(http_call, ports[1], case, mode, max_new, False))

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(run, jobs))


def sigstop_phase(tally: Tally, all_cases: list[Case], ports: tuple[int, int], max_new: int, concurrency: int,
                  pid: int, stop_s: float) -> tuple[int, int]:
    """Seeded ON streams (gRPC and SSE) sent continuously from 1 s before the draft worker's
    SIGSTOP to 2 s after its SIGCONT; returns how many were sent, and how many of them were
    in flight at some time while it was stopped."""
    done = threading.Event()
    spans: list[tuple[float, float]] = []

    def load(worker: int) -> None:
        i = worker
        while not done.is_set():
            case, start = all_cases[i % len(all_cases)], time.monotonic()
            if i % 2:
                tally.check("grpc-stream+SIGSTOP", "on", case, partial(grpc_call, ports[0], case, "on", max_new, True))
            else:
                tally.check("sse+SIGSTOP", "on", case, partial(http_call, ports[1], case, "on", max_new, True))
            spans.append((start, time.monotonic()))
            i += concurrency
    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        time.sleep(stop_s)
    finally:
        os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
    time.sleep(2.0)
    done.set()
    for t in threads:
        t.join(300)
    return len(spans), sum(start < resumed and end > stopped for start, end in spans)


def print_table(tally: Tally) -> bool:
    print(f"{'path':22s} {'mode':5s} identical/total  drafted tokens")
    for (path, mode), (same, total, drafted) in sorted(tally.counts.items()):
        print(f"{path:22s} {mode:5s} {f'{same}/{total}':15s}  {drafted:6d}{'' if same == total else '  DIFFERS'}")
    for line in tally.diffs:
        print("  " + line)
    return not tally.diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=6, help="requests in flight at once")
    parser.add_argument("--stop-s", type=float, default=4.0, help="how long the draft worker stays SIGSTOPped")
    args = parser.parse_args()
    all_cases = cases(args.seeds)
    started = time.monotonic()
    refs, decode = reference(all_cases, args.max_new)
    tally = Tally(refs, decode)
    print(f"reference: {len(refs)} requests in {time.monotonic() - started:.0f}s", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        process, port, http_port = start_server(workdir)
        try:
            mixed_phase(tally, all_cases, (port, http_port), args.max_new, args.concurrency)
            print(f"mixed phase done at {time.monotonic() - started:.0f}s", flush=True)
            sent, during = sigstop_phase(tally, all_cases, (port, http_port), args.max_new, args.concurrency,
                                 draft_pid(process), args.stop_s)
            print(f"SIGSTOP phase: {sent} streams, {during} of them in flight during the {args.stop_s:g}s stop",
                  flush=True)
        finally:
            code = stop_server(process)
            print(f"server exit status {code}", flush=True)
            if code != 0:
                print(open(os.path.join(workdir, "serve.log")).read()[-3000:])
    ok = print_table(tally)
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
