"""Every failure kind gets its gRPC status; a worker's own gRPC error is told apart (down:
UNAVAILABLE, anything else: INTERNAL) for both protocols, the HTTP API included."""

import grpc
import pytest

from specdec.async_engine import AdmissionError
from specdec.serving_errors import DeadlineExceededError, ErrorKind, InvalidRequestError, NotReadyError
from specdec_rpc.status_codes import UnknownServiceError, error_kind, status_for


class WorkerRpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "connection refused"


@pytest.mark.parametrize("exc, code", [
    (InvalidRequestError("prompt", "must not be empty"), grpc.StatusCode.INVALID_ARGUMENT),
    (AdmissionError("admission limit reached"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotReadyError("loading"), grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceededError("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (UnknownServiceError("no.such.Service"), grpc.StatusCode.NOT_FOUND),
    (KeyError("x"), grpc.StatusCode.INTERNAL),
])
def test_each_kind_has_its_status(exc, code):
    assert status_for(exc)[0] == code


def test_a_worker_that_is_down_is_unavailable_and_another_worker_error_internal():
    kind, message = error_kind(WorkerRpcError(grpc.StatusCode.UNAVAILABLE))
    assert kind is ErrorKind.UNAVAILABLE and "a model worker is unavailable" in message
    assert error_kind(WorkerRpcError(grpc.StatusCode.DATA_LOSS))[0] is ErrorKind.INTERNAL
    assert status_for(WorkerRpcError(grpc.StatusCode.UNAVAILABLE))[0] == grpc.StatusCode.UNAVAILABLE
