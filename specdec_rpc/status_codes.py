"""Which gRPC status code a failure of a public call gets (and the message sent with it).

INVALID_ARGUMENT: bad input (ValueError; the message names the field).
RESOURCE_EXHAUSTED: the router's admission limit is reached (retry later).
UNAVAILABLE: the server is not ready, shutting down, or a worker is unreachable (WorkerError).
DEADLINE_EXCEEDED: the call ran out of time (asyncio / builtin TimeoutError).
NOT_FOUND: a health check for an unknown service.
INTERNAL: anything else.
"""

from __future__ import annotations

import asyncio

import grpc

from specdec.engine_loop import AdmissionError, EngineClosedError
from specdec.errors import WorkerError
from specdec_rpc.remote_verifier import WORKER_DOWN


class NotReadyError(RuntimeError):
    """The server's models are still loading."""


class UnknownServiceError(LookupError):
    """A health check asked about a service this server does not have."""


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The public status code and details for an exception raised while serving a call."""
    if isinstance(exc, AdmissionError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, UnknownServiceError):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, (NotReadyError, EngineClosedError, WorkerError)):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        code = exc.code()
        if code in WORKER_DOWN:
            return grpc.StatusCode.UNAVAILABLE, f"a model worker is unavailable ({code.name}: {exc.details()})"
        return grpc.StatusCode.INTERNAL, f"a model worker failed ({code.name}: {exc.details()})"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):  # the same class since 3.11
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded"
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
