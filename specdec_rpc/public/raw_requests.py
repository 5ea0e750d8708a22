"""The public service registered so that request bytes reach the router undecoded.

Ray Serve's gRPC proxy decodes each request with the deserializer the servicer function
registered, before any of our code runs: a corrupt message (or invalid UTF-8 in a string
field) then fails inside the proxy and reaches the client as UNKNOWN. Registered through
`add_SpeculativeDecodingServicer_to_server` below instead (its import path goes into
Serve's `grpc_servicer_functions`), every method receives the raw bytes, and the router
parses them with `parse`: a message that does not decode is the caller's mistake,
INVALID_ARGUMENT, like any other bad input. Responses are unchanged. The standard health
service is registered the same way (`add_HealthServicer_to_server`), so corrupt bytes sent
to it are INVALID_ARGUMENT too.

`parse` also refuses what the decoder would silently change, naming the field: a varint
beyond its field's 32 bits (protobuf truncates it, so 2**32 + 1 in an int32 or enum field
reads as 1, an enum number outside the proto's values turning into a valid one), and a
known field sent with another wire type (protobuf would drop it as unknown: a temperature
sent as a double would silently mean greedy).
"""

from __future__ import annotations

from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2

from specdec_rpc.v1 import specdec_pb2

SERVICE = specdec_pb2.DESCRIPTOR.services_by_name["SpeculativeDecoding"]
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
_INT32 = (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_ENUM)
_UINT32 = (FieldDescriptor.TYPE_UINT32,)
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
        message = message_type.FromString(bytes(raw))
    except (DecodeError, ValueError) as exc:
        raise MalformedRequestError(
            f"request: not a valid {message_type.DESCRIPTOR.full_name} message ({exc or 'corrupt bytes'})"
        ) from None
    _check_varints(bytes(raw), message_type.DESCRIPTOR)
    return message


def _check_varints(raw: bytes, descriptor: Descriptor, prefix: str = "") -> None:
    """MalformedRequestError naming the field when a 32-bit field's varint does not fit 32
    bits (the bytes already decoded, so their structure is sound)."""
    at = 0
    while at < len(raw):
        tag, at = _read_varint(raw, at)
        field, wire_type = descriptor.fields_by_number.get(tag >> 3), tag & 7
        if wire_type == 0:
            value, at = _read_varint(raw, at)
            values = [value]
        elif wire_type == 2:
            length, at = _read_varint(raw, at)
            payload, at = raw[at:at + length], at + length
            if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                _check_varints(payload, field.message_type, f"{prefix}{field.name}.")
            values = _packed(payload) if field is not None and field.type in _INT32 + _UINT32 else []
        elif wire_type in (1, 5):
            at, values = at + (8 if wire_type == 1 else 4), []
        else:
            return  # a group: nothing of ours uses them
        if field is not None and wire_type not in _wire_types(field):
            raise MalformedRequestError(f"{prefix}{field.name}: sent as wire type {wire_type}, which is not its type's")
        if field is not None and any(not _fits(field, v) for v in values):
            bad = next(v for v in values if not _fits(field, v))
            raise MalformedRequestError(f"{prefix}{field.name}: {bad} does not fit the field's 32 bits")


def _wire_types(field: FieldDescriptor) -> tuple[int, ...]:
    """The wire types a field may arrive as (a repeated number also packed, as type 2)."""
    own = {FieldDescriptor.TYPE_DOUBLE: 1, FieldDescriptor.TYPE_FIXED64: 1, FieldDescriptor.TYPE_SFIXED64: 1,
           FieldDescriptor.TYPE_FLOAT: 5, FieldDescriptor.TYPE_FIXED32: 5, FieldDescriptor.TYPE_SFIXED32: 5,
           FieldDescriptor.TYPE_STRING: 2, FieldDescriptor.TYPE_BYTES: 2, FieldDescriptor.TYPE_MESSAGE: 2}
    wire = own.get(field.type, 0)
    return (wire, 2) if field.is_repeated and wire != 2 else (wire,)


def _fits(field: FieldDescriptor, value: int) -> bool:
    if field.type in _INT32:  # a negative int32 travels sign-extended to 64 bits
        return value < 2**31 or 2**64 - 2**31 <= value < 2**64
    return field.type not in _UINT32 or value < 2**32


def _packed(payload: bytes) -> list[int]:
    values, at = [], 0
    while at < len(payload):
        value, at = _read_varint(payload, at)
        values.append(value)
    return values


def _read_varint(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[at]
        value, shift, at = value | (byte & 0x7F) << shift, shift + 7, at + 1
        if not byte & 0x80:
            return value, at


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
    _add_raw_service(servicer, server, SERVICE)


def add_HealthServicer_to_server(servicer: Any, server: Any) -> None:  # noqa: N802 (gRPC naming)
    """Register grpc.health.v1.Health on `server` with raw request bytes (the servicer parses them)."""
    _add_raw_service(servicer, server, HEALTH)


def _add_raw_service(servicer: Any, server: Any, service: Any) -> None:
    """Every method the servicer has (the rest are UNIMPLEMENTED), taking raw bytes."""
    handlers = {method.name: _handler(servicer, method) for method in service.methods if hasattr(servicer, method.name)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    add_registered = getattr(server, "add_registered_method_handlers", None)
    if add_registered is not None:
        add_registered(service.full_name, handlers)
