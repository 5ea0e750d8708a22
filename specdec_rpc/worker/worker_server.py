"""Start and stop a grpc.aio server for a worker servicer (DraftWorker or TargetWorker).

`start_worker_server` runs on the caller's event loop (a Ray async actor's, say).
`ServerThread` runs one on its own event loop in a background thread, for synchronous
callers (tests, scripts). Messages may be large (q rows are 2 bytes x vocab per drafted
token), so both ends raise gRPC's 4 MiB default limit to MAX_MESSAGE_BYTES.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import grpc

from specdec_rpc.worker.internal_auth import SecretInterceptor
from specdec_rpc.v1 import worker_pb2_grpc

MAX_MESSAGE_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # a worker that restarts is back within seconds: retry connecting every 0.2-2 s, not
    # gRPC's default up to 120 s (calls in between fail fast with UNAVAILABLE)
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

_REGISTRARS = [
    (worker_pb2_grpc.DraftWorkerServicer, worker_pb2_grpc.add_DraftWorkerServicer_to_server),
    (worker_pb2_grpc.TargetWorkerServicer, worker_pb2_grpc.add_TargetWorkerServicer_to_server),
]


@dataclass
class WorkerServer:
    """A started server and the host:port it listens on."""

    server: grpc.aio.Server
    address: str
    servicer: object

    async def stop(self, grace_s: float | None = 5.0) -> None:
        """Stop accepting calls, end the round streams, let running calls finish for up to
        grace_s, then close the servicer."""
        end_streams = getattr(self.servicer, "end_streams", None)  # a WorkerServicer's round streams
        if end_streams is not None:
            end_streams()
        await self.server.stop(grace_s)
        self.servicer.close()


async def start_worker_server(
    servicer: object, host: str = "127.0.0.1", port: int = 0, secret: str | None = None
) -> WorkerServer:
    """Serve `servicer` on host:port (port 0 = a free port); returns the bound 'host:port'.
    With a secret, calls that do not present it are refused (UNAUTHENTICATED)."""
    interceptors = [SecretInterceptor(secret)] if secret else []
    server = grpc.aio.server(options=CHANNEL_OPTIONS, interceptors=interceptors)
    for base, register in _REGISTRARS:
        if isinstance(servicer, base):
            register(servicer, server)
            break
    else:
        raise TypeError(f"{type(servicer).__name__} is neither a DraftWorker nor a TargetWorker servicer")
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind a gRPC server to {host}:{port}")
    await server.start()
    servicer.start()  # background work on this loop (freeing the slots of lapsed leases)
    return WorkerServer(server, f"{host}:{bound}", servicer)


class ServerThread:
    """A worker server on its own event loop in a daemon thread (for synchronous code)."""

    def __init__(self, servicer: object, host: str = "127.0.0.1", port: int = 0, secret: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="worker-server", daemon=True)
        self._thread.start()
        try:
            self._server = self._call(start_worker_server(servicer, host, port, secret))
        except BaseException:
            self._stop_loop()
            raise
        self.address = self._server.address
        self.servicer = servicer

    def _call(self, coroutine, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def stop(self, grace_s: float | None = 1.0) -> None:
        """Stop the server and its event loop (idempotent)."""
        if not self._loop.is_running():
            return
        try:
            self._call(self._server.stop(grace_s))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
