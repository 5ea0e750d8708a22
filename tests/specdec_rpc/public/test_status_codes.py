"""Every failure kind gets its gRPC status; a worker's own gRPC error is told apart (down:
UNAVAILABLE, no free slot: RESOURCE_EXHAUSTED with a retry hint, anything else: INTERNAL)
for both protocols, the HTTP API included."""

import json

import grpc
import pytest

from specdec.serving.async_engine import AdmissionError
from specdec.config.config import load_config
from specdec.models.kv_cache import CacheFullError
from specdec.sampling.sampling_params import SamplingParams
from specdec.serving.serving_errors import (RETRY_AFTER_S, DeadlineExceededError, ErrorKind, InvalidRequestError,
                                            NotReadyError)
from specdec.verifiers.verifier import VerifyRequest
from specdec_http.http_api import HttpApi
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.public.status_codes import UnknownServiceError, error_kind, status_for
from specdec_rpc.worker.worker_server import ServerThread
from worker_slots import target_servicer


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


def test_a_worker_without_a_free_slot_is_resource_exhausted_and_429_with_a_retry_hint(prompt_ids):
    """A real target with one slot, held by one router: the next sequence's Verify fails with
    the worker's RESOURCE_EXHAUSTED, which public clients see as RESOURCE_EXHAUSTED / 429
    with Retry-After, never INTERNAL / 500."""
    config = load_config(overrides={"cache": {"num_slots": 1, "max_seq_len": 128}})
    with ServerThread(target_servicer(config)) as server:
        holder, other = RemoteVerifier(server.address), RemoteVerifier(server.address)
        try:
            holder.verify([VerifyRequest("a", prompt_ids[0], [], SamplingParams())])
            with pytest.raises(grpc.RpcError) as error:
                other.verify([VerifyRequest("b", prompt_ids[1], [], SamplingParams())])
        finally:
            holder.close()
            other.close()
    code, message = status_for(error.value)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no free cache slot" in message and f"retry in {RETRY_AFTER_S}s" in message
    response = HttpApi(frontend=None, error_kind=error_kind).error_response(error.value)
    assert response.status_code == 429 and response.headers["retry-after"] == str(RETRY_AFTER_S)
    assert json.loads(response.body)["error"]["code"] == "admission_limit"


def test_a_full_in_process_cache_is_overloaded_too():
    assert status_for(CacheFullError("KV cache is full"))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
