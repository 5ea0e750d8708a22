"""The public service registered so that request bytes reach the router undecoded.

Ray Serve's gRPC proxy decodes each request with the deserializer the servicer function
registered, before any of our code runs: a corrupt message (or invalid UTF-8 in a string
field) then fails inside the proxy and reaches the client as UNKNOWN. Registered through
`add_SpeculativeDecodingServicer_to_server` below instead (its import path goes into
Serve's `grpc_servicer_functions`), every method receives the raw bytes, and the router
parses them with `parse`: a message that does not decode is the caller's mistake,
INVALID_ARGUMENT, like any other bad input. Responses are unchanged.
"""

from __future__ import annotations

from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from specdec_rpc.v1 import specdec_pb2

SERVICE = specdec_pb2.DESCRIPTOR.services_by_name["SpeculativeDecoding"]
M = TypeVar("M", bound=Message)


class MalformedRequestError(ValueError):
    """The request bytes are not a valid message of the method's request type."""


def parse(raw: bytes | M, message_type: type[M]) -> M:
    """The request message from its wire bytes (a decoded message passes through, for
    hosts that decode themselves). Raises MalformedRequestError (INVALID_ARGUMENT)."""
    if isinstance(raw, message_type):
        return raw
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise MalformedRequestError(f"request: expected {message_type.DESCRIPTOR.name} bytes, got {type(raw).__name__}")
    try:
        return message_type.FromString(bytes(raw))
    except (DecodeError, ValueError) as exc:
        raise MalformedRequestError(
            f"request: not a valid {message_type.DESCRIPTOR.full_name} message ({exc or 'corrupt bytes'})"
        ) from None


def _handler(servicer: Any, method: Any) -> grpc.RpcMethodHandler:
    """A handler passing the request bytes through (no request deserializer)."""
    behaviour = getattr(servicer, method.name)
    serialize = lambda response: response.SerializeToString()  # noqa: E731
    if method.server_streaming:
        return grpc.unary_stream_rpc_method_handler(behaviour, request_deserializer=None,
                                                    response_serializer=serialize)
    return grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=None, response_serializer=serialize)


def add_SpeculativeDecodingServicer_to_server(servicer: Any, server: Any) -> None:  # noqa: N802 (gRPC naming)
    """Register specdec.v1.SpeculativeDecoding on `server` with raw request bytes."""
    handlers = {method.name: _handler(servicer, method) for method in SERVICE.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    add_registered = getattr(server, "add_registered_method_handlers", None)
    if add_registered is not None:
        add_registered(SERVICE.full_name, handlers)
