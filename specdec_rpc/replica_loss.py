"""A router replica that dies mid-call: how Ray Serve reports it, and the client's reading of it.

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

So the client recognises exactly that failure, by the text Ray gives those two errors, and
treats it as what it is: UNAVAILABLE (the call did not fail because of its input, and
Serve restarts the replica), which the client retries like any other UNAVAILABLE.
Other gRPC clients of the public port still see INTERNAL for it.
"""

from __future__ import annotations

import re

import grpc

#: the start of str(ActorDiedError) / str(RayActorError) / str(ActorUnavailableError) in ray.exceptions
_RAY_ACTOR_LOST = re.compile(
    r"^The actor (?:died unexpectedly|experienced an error) before finishing this task\."
    r"|^The actor [0-9a-f]+ is unavailable: "
)


def is_replica_loss(exc: BaseException) -> bool:
    """True for Serve's INTERNAL status of a call whose replica died (see the module doc)."""
    if not isinstance(exc, grpc.RpcError) or not callable(getattr(exc, "code", None)):
        return False
    return exc.code() == grpc.StatusCode.INTERNAL and bool(_RAY_ACTOR_LOST.match(exc.details() or ""))


class ReplicaLostError(grpc.RpcError):
    """UNAVAILABLE: the router replica serving the call died; `original` is Serve's INTERNAL error."""

    def __init__(self, original: grpc.RpcError) -> None:
        super().__init__(original)
        self.original = original

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        first_line = (self.original.details() or "").splitlines()[0] if self.original.details() else ""
        return f"the router replica serving this call died (Ray Serve reported INTERNAL: {first_line})"

    def trailing_metadata(self):
        return getattr(self.original, "trailing_metadata", lambda: None)()

    def __str__(self) -> str:
        return f"{self.code().name}: {self.details()}"


def as_unavailable(exc: grpc.RpcError) -> grpc.RpcError:
    """exc itself, or a ReplicaLostError (UNAVAILABLE) when it reports a dead replica."""
    return ReplicaLostError(exc) if is_replica_loss(exc) else exc
