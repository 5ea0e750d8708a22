"""What can go wrong with a served request, in the core's terms; each protocol maps the kind
to its own status (gRPC: `specdec_rpc.public.status_codes`, HTTP: `specdec_http.openai_api`).

    kind          raised as                                    gRPC                HTTP
    invalid       ValueError (InvalidRequestError names param)  INVALID_ARGUMENT    400
    unauthenticated AuthenticationError (no valid bearer token) UNAUTHENTICATED     401
    not_found     NotFoundError                                 NOT_FOUND           404
    overloaded    AdmissionError (the admission limit), a       RESOURCE_EXHAUSTED  429 + Retry-After
                  worker without a free cache slot
    unavailable   NotReadyError, EngineClosedError, WorkerError UNAVAILABLE         503
    deadline      TimeoutError (DeadlineExceededError)          DEADLINE_EXCEEDED   504
    internal      anything else                                 INTERNAL            500

An overloaded server says when to try again: RETRY_AFTER_S (HTTP's Retry-After header,
gRPC's `retry-after` trailing metadata, and the message).
"""

from __future__ import annotations

import asyncio
import enum
import re

from specdec.serving.api_auth import AuthenticationError
from specdec.serving.async_engine import AdmissionError, EngineClosedError
from specdec.requests.errors import InvalidRequestError, WorkerError
from specdec.models.kv_cache import CacheFullError

__all__ = ["RETRY_AFTER_S", "AdmissionError", "AuthenticationError", "DeadlineExceededError", "ErrorKind",
           "InvalidRequestError", "NotFoundError",
           "NotReadyError", "classify", "param_of"]


#: seconds an overloaded server asks a client to wait before trying again
RETRY_AFTER_S = 1


class ErrorKind(enum.Enum):
    INVALID = "invalid"
    UNAUTHENTICATED = "unauthenticated"
    NOT_FOUND = "not_found"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    DEADLINE = "deadline"
    INTERNAL = "internal"


class NotReadyError(RuntimeError):
    """The server's models are still loading (or failed to load)."""


class NotFoundError(LookupError):
    """The request named something this server does not have (a model, a service, a route)."""


class DeadlineExceededError(TimeoutError):
    """The request's own deadline passed before it finished (its cache slots are freed)."""


def classify(exc: BaseException) -> ErrorKind:
    """The kind of a failure raised while serving a request (core exceptions only)."""
    if isinstance(exc, AuthenticationError):
        return ErrorKind.UNAUTHENTICATED
    if isinstance(exc, (AdmissionError, CacheFullError)):
        return ErrorKind.OVERLOADED
    if isinstance(exc, NotFoundError):
        return ErrorKind.NOT_FOUND
    if isinstance(exc, (NotReadyError, EngineClosedError, WorkerError)):
        return ErrorKind.UNAVAILABLE
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):  # the same class since 3.11
        return ErrorKind.DEADLINE
    if isinstance(exc, ValueError):
        return ErrorKind.INVALID
    return ErrorKind.INTERNAL


_LEADING_FIELD = re.compile(r"^([a-z_][a-z0-9_.]*)(?::| must| exceeds| \d)")


def param_of(exc: BaseException) -> str | None:
    """The field a bad-input error names: its `param`, else the field its message starts
    with ("top_p must be ...", "stop: ..."), else None."""
    param = getattr(exc, "param", None)
    if param:
        return param
    match = _LEADING_FIELD.match(str(exc))
    return match.group(1) if match else None
