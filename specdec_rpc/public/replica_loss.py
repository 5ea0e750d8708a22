"""A router replica that dies mid-call: how Ray Serve reports it, and how every client reads it.

Measured on Ray 2.60 (SIGKILL of the SpecdecRouter replica's process while streams ran):
Serve's gRPC proxy ends the calls in flight on that replica with **INTERNAL**, details
"The actor died unexpectedly before finishing this task.\\n\\tclass_name:
ServeReplica:<app>:<deployment> ...". The proxy maps every exception from the replica's
actor to INTERNAL except a few Serve errors (`get_grpc_response_status` in
ray/serve/_private/grpc_util.py: timeouts, cancellation, back-pressure,
DeploymentUnavailableError, a status the replica set itself); a dead replica raises Ray's
ActorDiedError (or ActorUnavailableError), which is none of them, and being dead it cannot
set a status itself. Serve offers no hook to change that mapping. Calls that arrive while
the replica is being replaced wait for the new one and get UNAVAILABLE until it is ready.

That failure is recognised exactly, by the text Ray gives those two errors, and reported as
what it is: UNAVAILABLE (the call did not fail because of its input, and Serve restarts the
replica), in two places:
* inside Serve's gRPC proxy, for every client: `report_replica_loss_as_unavailable`, the
  first of the router's servicer functions, wraps the handlers Serve's server makes for
  each method, and rewrites that status on the call's context before it is sent;
* in specdec's client (`as_unavailable`), for a proxy started without that function; the
  client retries it like any other UNAVAILABLE.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import grpc

#: the start of str(ActorDiedError) / str(RayActorError) / str(ActorUnavailableError) in ray.exceptions
_RAY_ACTOR_LOST = re.compile(
    r"^The actor (?:died unexpectedly|experienced an error) before finishing this task\."
    r"|^The actor [0-9a-f]+ is unavailable: "
)


def is_lost_replica_status(code: Any, details: str | None) -> bool:
    """True for the status Serve gives a call whose replica died (see the module doc)."""
    return code == grpc.StatusCode.INTERNAL and bool(_RAY_ACTOR_LOST.match(details or ""))


def is_replica_loss(exc: BaseException) -> bool:
    """True for Serve's INTERNAL status of a call whose replica died (see the module doc)."""
    if not isinstance(exc, grpc.RpcError) or not callable(getattr(exc, "code", None)):
        return False
    return is_lost_replica_status(exc.code(), exc.details())


def lost_replica_details(details: str | None) -> str:
    """What a client is told about a call whose replica died (the first line of Ray's text)."""
    first_line = details.splitlines()[0] if details else ""
    return f"the router replica serving this call died (Ray Serve reported INTERNAL: {first_line})"


class ReplicaLostError(grpc.RpcError):
    """UNAVAILABLE: the router replica serving the call died; `original` is Serve's INTERNAL error."""

    def __init__(self, original: grpc.RpcError) -> None:
        super().__init__(original)
        self.original = original

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return lost_replica_details(self.original.details())

    def trailing_metadata(self):
        return getattr(self.original, "trailing_metadata", lambda: None)()

    def __str__(self) -> str:
        return f"{self.code().name}: {self.details()}"


def as_unavailable(exc: grpc.RpcError) -> grpc.RpcError:
    """exc itself, or a ReplicaLostError (UNAVAILABLE) when it reports a dead replica."""
    return ReplicaLostError(exc) if is_replica_loss(exc) else exc


def _report_on(context: Any) -> None:
    """Rewrite a dead replica's INTERNAL status on a server-side call context to UNAVAILABLE."""
    details = context.details()
    details = details.decode(errors="replace") if isinstance(details, bytes) else details
    if is_lost_replica_status(context.code(), details):
        context.set_code(grpc.StatusCode.UNAVAILABLE)
        context.set_details(lost_replica_details(details))


def reporting_replica_loss(handler: Any) -> Any:
    """`handler` (a unary or streaming gRPC server behaviour of Serve's proxy, which ends a
    call by setting its status on the context) with a dead replica's status rewritten."""
    if inspect.isasyncgenfunction(handler):
        @functools.wraps(handler)
        async def streaming(request: Any, context: Any) -> Any:
            async for message in handler(request, context):
                yield message
            _report_on(context)

        return streaming

    @functools.wraps(handler)
    async def unary(request: Any, context: Any) -> Any:
        response = await handler(request, context)
        _report_on(context)
        return response

    return unary


def report_replica_loss_as_unavailable(servicer: Any, server: Any) -> None:
    """A servicer function for Serve's gRPC proxy (list it before those that register
    services): every handler the server makes afterwards reports a dead replica as UNAVAILABLE."""
    make_handler = server.service_handler_factory

    @functools.wraps(make_handler)
    def factory(*args: Any, **kwargs: Any) -> Any:
        return reporting_replica_loss(make_handler(*args, **kwargs))

    server.service_handler_factory = factory
