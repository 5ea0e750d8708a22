"""Which gRPC status code a failure of a public call gets (and the message sent with it).

The core says what kind of failure it is (`specdec.serving.serving_errors.classify`); this maps
the kind to gRPC, after recognising the one thing only gRPC knows: a model worker's own
gRPC error (UNAVAILABLE when the worker is down, RESOURCE_EXHAUSTED when it has no free
cache slot, INTERNAL otherwise).

INVALID_ARGUMENT: bad input (ValueError; the message names the field).
RESOURCE_EXHAUSTED: the router's admission limit is reached, or a worker's cache slots are
all taken (retry after RETRY_AFTER_S: the message says so; the router adds `retry-after`).
UNAVAILABLE: the server is not ready, shutting down, or a worker is unreachable (WorkerError).
DEADLINE_EXCEEDED: the call ran out of time (asyncio / builtin TimeoutError).
NOT_FOUND: a health check for an unknown service.
INTERNAL: anything else.
"""

from __future__ import annotations

import grpc

from specdec.serving.serving_errors import RETRY_AFTER_S, ErrorKind, NotFoundError, NotReadyError, classify
from specdec_rpc.worker.remote_verifier import WORKER_DOWN

__all__ = ["NotReadyError", "UnknownServiceError", "error_kind", "status_for"]

CODES = {
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.DEADLINE: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}


class UnknownServiceError(NotFoundError):
    """A health check asked about a service this server does not have."""


def error_kind(exc: BaseException) -> tuple[ErrorKind, str]:
    """The kind of failure and its message, a worker's gRPC error included (for every
    protocol: the HTTP shim asks this too, since only this package knows gRPC errors)."""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        code = exc.code()
        if code in WORKER_DOWN:
            return ErrorKind.UNAVAILABLE, f"a model worker is unavailable ({code.name}: {exc.details()})"
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return ErrorKind.OVERLOADED, (f"a model worker has no free cache slot ({exc.details()}); "
                                          f"retry in {RETRY_AFTER_S}s")
        return ErrorKind.INTERNAL, f"a model worker failed ({code.name}: {exc.details()})"
    kind = classify(exc)
    if kind is ErrorKind.INTERNAL:
        return kind, f"{type(exc).__name__}: {exc}"
    if kind is ErrorKind.DEADLINE:
        return kind, str(exc) or "deadline exceeded"
    return kind, str(exc)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The public status code and details for an exception raised while serving a call."""
    kind, message = error_kind(exc)
    return CODES[kind], message
