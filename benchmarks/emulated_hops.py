"""Where one served round's framework time goes, call by call, on emulated devices (no Ray, no Serve).

The draft and the target workers run as they do in the served stack (a DraftServicer and a
TargetServicer behind grpc.aio servers), each in its own process; the router's engine
(RemoteProposer + RemoteVerifier) runs here. Every Propose and Verify call is timed at six
points on the machine's monotonic clock (shared by all processes):

    router:  enter (the engine calls the client) -> sent (the request message is built, the stub called)
    worker:  handler (grpc.aio's handler starts: deserialised) -> thread (the model step starts on the
             worker thread) -> done (the model step ends) -> reply (the handler returns)
    router:  back (the client returns to the engine)

so that a call's time beyond its device time splits into: build (enter -> sent), in (sent ->
handler: serialise, transport, deserialise, the event loop's wake-up), to thread (handler ->
thread: lock, history deltas, the hand-off), step host (done - thread - device - late: the
model's host work), late (the device waits' wake-up delays), from thread (done -> reply: the
hand-off back, the reply message), out (reply -> back: serialise, transport, the router's
wake-up and parsing). The in-process engine runs the
same requests on the same profile, interleaved run by run.

Usage: python benchmarks/emulated_hops.py [--profile h100-llama-8b-1b] [--streams 1 8 32]
    [--runs 2] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SPANS = ("build", "in", "to_thread", "step_host", "late", "from_thread", "out")


def overrides(profile: str, slots: int) -> dict:
    return {
        "models": {"target": f"emulated:{profile}:target", "draft": f"emulated:{profile}:draft"},
        "cache": {"num_slots": slots, "max_seq_len": 1024},
        "speculation": {"proposer": "draft", "gamma": 4, "overlap": False},
        "load_monitor": {"enabled": False},
    }


# ---------------------------------------------------------------- worker process

def _timed_worker(servicer, method: str) -> list:
    """Wrap the servicer's round call and its worker-thread step with timestamps; returns the
    list each call appends (handler, thread, done, device seconds, late seconds, reply) to."""
    from specdec.models.emulated_device import process_devices

    calls, handler, run = [], getattr(servicer, method), servicer._run

    def busy() -> tuple[float, float]:
        devices = process_devices()
        return sum(d["busy_s"] for d in devices), sum(d["late_s"] for d in devices)

    def timed_run(*args):
        start, (busy_before, late_before) = time.monotonic(), busy()
        result = run(*args)
        busy_after, late_after = busy()
        timed_run.last = (start, time.monotonic(), busy_after - busy_before, late_after - late_before)
        return result

    async def timed_handler(request, context):
        entered = time.monotonic()
        reply = await handler(request, context)
        calls.append((entered, *timed_run.last, time.monotonic()))
        return reply

    servicer._run = timed_run
    setattr(servicer, method, timed_handler)
    return calls


def _drive(coroutine):
    """Run a coroutine that never suspends (an uncontended lock, a step on the calling thread) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    coroutine.close()
    raise RuntimeError("the call suspended: a synchronous server cannot serve it")


class SyncServer:
    """A prototype: the servicer's round calls served by a synchronous gRPC server (grpc.server,
    a thread pool), each call's handler run to its end on the handler's thread (every model step
    inline, no event loop). No lease reaper, no metrics: it measures the transport only."""

    def __init__(self, servicer, role: str) -> None:
        from concurrent import futures

        import grpc
        from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
        from specdec_rpc.worker import worker_servicer
        from specdec_rpc.worker.worker_server import CHANNEL_OPTIONS

        worker_servicer.INLINE_MAX_TOKENS = 1 << 30
        servicer.inline_steps = True
        method = "Propose" if role == "draft" else "Verify"
        handler = getattr(servicer, method)

        class Adapter:
            def GetInfo(self, request, context):
                return _drive(servicer.GetInfo(request, context))

            def KeepAlive(self, request, context):
                return _drive(servicer.KeepAlive(request, context))

            def Release(self, request, context):
                servicer._release(list(request.seq_ids))
                servicer.leases.released(request.seq_ids)
                return worker_pb2.ReleaseResponse()

        def unary(request, context):
            return _drive(handler(request, context))

        def stream(requests, context):
            for request in requests:
                yield _drive(handler(request, context))

        adapter = Adapter()
        setattr(adapter, method, unary)
        setattr(adapter, method + "Stream", stream)
        register = (worker_pb2_grpc.add_DraftWorkerServicer_to_server if role == "draft"
                    else worker_pb2_grpc.add_TargetWorkerServicer_to_server)
        self.server = grpc.server(futures.ThreadPoolExecutor(8), options=CHANNEL_OPTIONS)
        register(adapter, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(1.0)


def worker(role: str, profile: str, slots: int, server_kind: str = "aio") -> None:
    """Serve one role; print the address, then answer 'spans' (the calls timed since the last
    'spans') on stdin until 'quit'."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from specdec.config.config import load_config
    from specdec_rpc.worker.draft_servicer import DraftServicer
    from specdec_rpc.worker.worker_server import ServerThread
    from worker_slots import target_servicer

    config = load_config(overrides=overrides(profile, slots))
    servicer = DraftServicer.from_config(config) if role == "draft" else target_servicer(config)
    calls = _timed_worker(servicer, "Propose" if role == "draft" else "Verify")
    server = ServerThread(servicer) if server_kind == "aio" else SyncServer(servicer, role)
    print(server.address, flush=True)
    for line in sys.stdin:
        if line.strip() == "spans":
            taken, calls[:] = list(calls), []
            print(json.dumps(taken), flush=True)
        elif line.strip() == "quit":
            break
    server.stop()


# ---------------------------------------------------------------- router side

class Worker:
    """A worker process of one role."""

    def __init__(self, role: str, profile: str, slots: int, server_kind: str = "aio") -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", role, "--profile", profile,
                                      "--slots", str(slots), "--server", server_kind],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.address = self.proc.stdout.readline().strip()

    def spans(self) -> list:
        self.proc.stdin.write("spans\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(30)


def _timed_client(client, method: str, stub_method: str) -> list:
    """Time the client's round call (enter, sent, back) around its stub's method."""
    calls, outer = [], getattr(client, method)
    sent = []

    class Stub:
        def __init__(self, stub):
            self._stub = stub

        def __getattr__(self, name):
            found = getattr(self._stub, name)
            if name != stub_method:
                return found
            return Multi(found)

    class Multi:
        def __init__(self, multi):
            self._multi = multi

        def __call__(self, *a, **k):
            sent.append(time.monotonic())
            return self._multi(*a, **k)

        def future(self, *a, **k):
            sent.append(time.monotonic())
            return self._multi.future(*a, **k)

    rounds = getattr(client, "_rounds", None)
    if rounds is not None:  # the round stream: time each request it sends
        send = rounds.send
        rounds.send = lambda request: (sent.append(time.monotonic()), send(request))[1]
    else:
        client._stub = Stub(client._stub)

    def timed(*args, **kwargs):
        sent.clear()
        entered = time.monotonic()
        result = outer(*args, **kwargs)
        back = time.monotonic()
        if len(sent) == 1:
            calls.append((entered, sent[0], back))
        else:
            calls.append(None)  # resync or no call: not attributed
        return result

    setattr(client, method, timed)
    return calls


def breakdown(router: list, worker: list) -> dict:
    """Mean ms per call of each span, matched call by call (router and worker in the same order)."""
    spans = {name: [] for name in (*SPANS, "device", "call")}
    pairs = [(r, w) for r, w in zip([c for c in router if c is not None], worker)]
    for (enter, sent, back), (handler, thread, done, device_s, late_s, reply) in pairs:
        for name, value in (("build", sent - enter), ("in", handler - sent), ("to_thread", thread - handler),
                            ("step_host", done - thread - device_s - late_s), ("late", late_s),
                            ("from_thread", reply - done),
                            ("out", back - reply), ("device", device_s), ("call", back - enter)):
            spans[name].append(1000 * value)
    return {name: statistics.mean(v) if v else float("nan") for name, v in spans.items()}


def thread_use(workers: dict):
    """A reading of the scheduler counters of this process's and the workers' threads
    (`served_threads.py`); its difference per round: CPU, run-queue wait and wake-ups."""
    from served_threads import thread_counters

    pids = {"router": os.getpid(), **{role: w.proc.pid for role, w in workers.items()}}
    return {role: thread_counters(pid) for role, pid in pids.items()}


def thread_delta(before: dict, after: dict, rounds: int) -> dict:
    """Per process: ms of CPU and of run-queue wait and wake-ups per round, in all and of its
    busiest thread (the round thread in the router, the event loop in a worker)."""
    from served_threads import thread_deltas

    out = {}
    for role, threads in after.items():
        per = [(t["cpu_ms"], t["wait_ms"], t["wakeups"]) for t in thread_deltas(before[role], threads, rounds)]
        busiest = max(per)
        out[role] = {"cpu_ms": sum(p[0] for p in per), "wait_ms": sum(p[1] for p in per),
                     "wakeups": sum(p[2] for p in per), "busiest_cpu_ms": busiest[0], "busiest_wait_ms": busiest[1],
                     "busiest_wakeups": busiest[2]}
    return out


def served_run(profile: str, workers: dict, prompts: list, max_new: int) -> dict:
    from specdec.config.config import load_config
    from specdec.wiring.engine_builder import build_engine
    from specdec_rpc.worker.remote_proposer import RemoteProposer
    from specdec_rpc.worker.remote_verifier import RemoteVerifier

    verifier = RemoteVerifier(workers["target"].address)
    draft = RemoteProposer(workers["draft"].address)
    try:
        calls = {"draft": _timed_client(draft, "propose", "Propose"),
                 "target": _timed_client(verifier, "verify", "Verify")}
        built = build_engine(load_config(overrides=overrides(profile, len(prompts) + 8)), verifier, draft)
        for w in workers.values():
            w.spans()  # drop warm-up calls
        result = timed_generate(built, prompts, max_new, lambda: thread_use(workers))
        result["calls"] = {role: breakdown(calls[role], workers[role].spans()) for role in workers}
    finally:
        verifier.close()
        draft.close()
    return result


def timed_generate(built, prompts: list, max_new: int, reading=None) -> dict:
    from specdec.models.emulated_device import process_devices
    from specdec.requests.request import GenerationRequest

    engine = built.engine
    engine.generate([GenerationRequest(built.encode(p), 4) for p in prompts])  # warm-up
    before = dict(engine.profile.to_dict())
    busy = sum(d["busy_s"] for d in process_devices())
    threads = reading() if reading else None
    start = time.perf_counter()
    results = engine.generate([GenerationRequest(built.encode(p), max_new) for p in prompts])
    wall = time.perf_counter() - start
    after = engine.profile.to_dict()
    rounds = after["rounds"] - before["rounds"]
    threads = thread_delta(threads, reading(), max(1, rounds)) if reading else None
    per = 1000.0 / max(1, rounds)
    delta = {k: (after[k] - before[k]) * per for k in after if k != "rounds"}
    return {"tokens_per_s": sum(len(r.token_ids) for r in results) / wall, "rounds": rounds,
            "round_ms": delta["round_s"], "propose_ms": delta["propose_s"], "verify_ms": delta["verify_s"],
            "local_device_ms": 1000 * (sum(d["busy_s"] for d in process_devices()) - busy) / max(1, rounds),
            **({"threads": threads} if threads else {})}


def in_process_run(built, prompts: list, max_new: int) -> dict:
    return timed_generate(built, prompts, max_new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="h100-llama-8b-1b")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--worker", choices=("draft", "target"), default=None)
    parser.add_argument("--slots", type=int, default=40)
    parser.add_argument("--json", default=None)
    parser.add_argument("--server", choices=("aio", "sync"), nargs="+", default=["aio"],
                        help="the workers' server: grpc.aio (as served) and/or the synchronous prototype (interleaved)")
    parser.add_argument("--beside-stack", choices=("on", "off"), nargs="+", default=["off"],
                        help="phases of --runs runs each: 'on' with an idle served stack (Ray, Serve, the router, "
                        "its workers: started here, sent nothing) beside them, 'off' without (what its background "
                        "costs the round on this machine's cores)")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.profile, args.slots, args.server[0])
    import torch

    torch.set_num_threads(1)
    from specdec.config.config import load_config
    from specdec.wiring.engine_builder import build_engine

    slots = max(args.streams) + 8
    servers = {kind: {role: Worker(role, args.profile, slots, kind) for role in ("draft", "target")}
               for kind in args.server}
    local = build_engine(load_config(overrides=overrides(args.profile, slots)))
    rows, stack = [], IdleStack(args.profile)
    try:
        for phase, beside in enumerate(args.beside_stack):
            stack.set(beside == "on")
            rows += runs_of(args, servers, local, stack, phase)
    finally:
        stack.set(False)
        for workers in servers.values():
            for w in workers.values():
                w.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


class IdleStack:
    """`specdec serve`'s stack on the profile's emulated devices, up or down, never sent a request."""

    def __init__(self, profile: str) -> None:
        self.profile, self.app, self.processes = profile, None, []

    def set(self, up: bool) -> None:
        if up and self.app is None:
            import psutil
            from actors.app import free_port, start_app
            from emulated_serving import emulated_overrides
            from specdec.config.config import load_config

            base = emulated_overrides(self.profile, 1.0, 8)
            base["serving"].update(port=free_port(), http_port=free_port(), direct_port=free_port(),
                                   direct_http_port=free_port())
            self.app = start_app(load_config(overrides=base),
                                 ray_init_kwargs={"include_dashboard": False, "log_to_driver": False})
            workers = {p.pid for p in psutil.Process().children() if "--worker" in " ".join(p.cmdline())}
            self.processes = [p for p in psutil.Process().children(recursive=True) if p.pid not in workers]
        elif not up and self.app is not None:
            self.app.shutdown()
            self.app, self.processes = None, []

    def cpu_s(self) -> float:
        """CPU seconds the stack's processes used so far (this driver's own Ray threads not counted)."""
        total = 0.0
        for p in self.processes:
            try:
                total += sum(p.cpu_times()[:2])
            except Exception:  # noqa: BLE001 - ended meanwhile
                pass
        return total


def runs_of(args: argparse.Namespace, servers: dict, local, stack: IdleStack, phase: int) -> list[dict]:
    """`args.runs` runs of every setup at every stream count (the stack's CPU use per second beside each row)."""
    from specdec.models.model_paths import bundled_prompts

    rows = []
    for run in range(args.runs):
        for streams in args.streams:
            prompts = [bundled_prompts()[i % 8] for i in range(streams)]
            for setup in ("in-process", *(f"served-{kind}" for kind in servers)):
                cpu, start = stack.cpu_s(), time.perf_counter()
                row = (in_process_run(local, prompts, args.max_new_tokens) if setup == "in-process"
                       else served_run(args.profile, servers[setup[7:]], prompts, args.max_new_tokens))
                row.update(run=run, streams=streams, setup=setup, phase=phase, stack=stack.app is not None,
                           stack_cpu_per_s=(stack.cpu_s() - cpu) / (time.perf_counter() - start))
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
