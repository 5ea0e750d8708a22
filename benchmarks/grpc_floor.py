"""The transport's floor on this machine: one gRPC round trip between two processes, no model.

A served speculative round makes two worker calls on the critical path (the draft's Propose,
then the target's Verify), each a request and a reply on a persistent bidirectional stream
(`specdec_rpc.worker.round_stream`). This measures the same shape with nothing else in it: a
grpc.aio server in a child process echoes each message on a stream-stream call, and a client
thread here sends one message, waits for its echo, and sends the next, as the router's round
thread does. Payloads are bytes (no protobuf work), sized like a one-row round's messages.

Each message pair is timed twice: back to back, and with the client sleeping `--gap-ms` between
pairs (a round's device waits: the threads on both sides sleep meanwhile, as they do between a
round's calls). Prints the median and p90 round trip of each, in ms; twice that median is what a
served ON round pays for its two calls before any work of its own.

    python benchmarks/grpc_floor.py [--pairs 400] [--gap-ms 6] [--bytes 200]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import statistics
import threading
import time

import grpc

METHOD = "/floor.Echo/Stream"


def _serve(port_out, ready) -> None:
    async def echo(requests, context):
        async for message in requests:
            yield message

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(echo)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("floor.Echo", {"Stream": handler})])
        port_out.value = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def round_trips(stub, pairs: int, gap_s: float, size: int) -> list[float]:
    """Seconds per message pair on one stream, one message in flight at a time."""
    outgoing: queue.Queue = queue.Queue()
    replies = stub(iter(outgoing.get, None))
    payload = b"x" * size
    times = []
    for _ in range(pairs):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        outgoing.put(payload)
        next(replies)
        times.append(time.perf_counter() - start)
    outgoing.put(None)
    return times


def summary(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    return (f"{name:>28}: median {statistics.median(ordered) * 1e3:.3f} ms, "
            f"p90 {ordered[int(0.9 * len(ordered))] * 1e3:.3f} ms over {len(ordered)} pairs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--gap-ms", type=float, default=6.0)
    parser.add_argument("--bytes", type=int, default=200)
    args = parser.parse_args()
    port, ready = multiprocessing.Value("i", 0), multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(port, ready), daemon=True)
    server.start()
    ready.wait(30)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port.value}") as channel:
            stub = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)
            round_trips(stub, 50, 0.0, args.bytes)  # warm-up: the connection and both sides' threads
            print(summary("back to back", round_trips(stub, args.pairs, 0.0, args.bytes)))
            gapped = round_trips(stub, args.pairs, args.gap_ms / 1e3, args.bytes)
            print(summary(f"after {args.gap_ms:g} ms asleep", gapped))
            print(f"two calls per served ON round: {2 * statistics.median(gapped) * 1e3:.2f} ms of transport")
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    threading.current_thread().name = "client"
    main()
