"""`emulated_hops.py` with its transport spans split at the router's threads (same arguments).

emulated_hops.py times each Propose and Verify call at its ends; its "in" and "out" spans hold
the whole transport. Here the router also notes when the round stream's sending thread (gRPC's
request consumer) takes each request off its queue and when each call is answered on the
router (`StreamCall._set`: by the round thread itself for a Verify, by the stream's reader
thread for a Propose), so each call's row in the output also has, as medians in ms:

    send_hop   the round thread queued the request -> the sending thread took it
    wire_in    the sending thread serialises and writes it -> the worker's handler starts (both
               gRPC cores, the socket, the worker's poller thread, event loop and deserialising)
    wire_out   the handler returned -> the call is answered on the router (the worker
               serialises and writes, gRPC's channel thread reads and deserialises, and wakes
               whoever reads the stream)
    to_round   answered -> the client returns to the engine (a Propose: the reader thread's
               hand-over to the waiting round thread; then the reply's checks)

Usage: python benchmarks/hop_split.py --streams 1 8 --runs 2 --max-new-tokens 96 [--json out.json]
"""

from __future__ import annotations

import bisect
import statistics
import time

import emulated_hops
from specdec_rpc.v1 import worker_pb2
from specdec_rpc.worker import round_stream

ROLES = {worker_pb2.ProposeRequest: "draft", worker_pb2.VerifyRequest: "target",
         worker_pb2.ProposeResponse: "draft", worker_pb2.VerifyResponse: "target"}
taken: dict[str, list[float]] = {"draft": [], "target": []}  # the sending thread took a request
answered: dict[str, list[float]] = {"draft": [], "target": []}  # a call was answered on the router
clients: dict[int, str] = {}  # id of a client's call list -> its role


def _install() -> None:
    """Note the two router-side instants of every round-stream call."""
    requests, answer = round_stream._requests, round_stream.StreamCall._set

    def noted_requests(queue):
        for request in requests(queue):
            taken[ROLES[type(request)]].append(time.monotonic())
            yield request

    def noted_set(call, response=None, error=None):
        if response is not None:
            answered[ROLES[type(response)]].append(time.monotonic())
        return answer(call, response, error)

    round_stream._requests, round_stream.StreamCall._set = noted_requests, noted_set
    timed_client, breakdown = emulated_hops._timed_client, emulated_hops.breakdown

    def tagged_client(client, method: str, stub_method: str) -> list:
        calls = timed_client(client, method, stub_method)
        clients[id(calls)] = "draft" if stub_method == "Propose" else "target"
        return calls

    def split_breakdown(router: list, worker: list) -> dict:
        spans = breakdown(router, worker)
        spans.update(split(clients[id(router)], router, worker))
        return spans

    emulated_hops._timed_client, emulated_hops.breakdown = tagged_client, split_breakdown


def _within(times: list[float], start: float, end: float, last: bool = False) -> float | None:
    """The first (or last) of the sorted `times` in [start, end], None when none is."""
    i = bisect.bisect_left(times, start)
    j = bisect.bisect_right(times, end)
    return None if i == j else times[j - 1 if last else i]


def split(role: str, router: list, worker: list) -> dict:
    """Medians (ms) of the four spans over the calls matched one to one (as `breakdown`)."""
    parts = {"send_hop": [], "wire_in": [], "wire_out": [], "to_round": []}
    pairs = zip([c for c in router if c is not None], worker)
    for (_enter, sent, back), (handler, _thread, _done, _device, _late, reply) in pairs:
        took = _within(taken[role], sent, back)
        done = _within(answered[role], sent, back, last=True)
        if took is None or done is None:
            continue
        for name, value in (("send_hop", took - sent), ("wire_in", handler - took),
                            ("wire_out", done - reply), ("to_round", back - done)):
            parts[name].append(1000 * value)
    taken[role].clear()
    answered[role].clear()
    return {name: statistics.median(v) if v else float("nan") for name, v in parts.items()}


if __name__ == "__main__":
    _install()  # the worker processes run emulated_hops.py itself
    emulated_hops.main()
