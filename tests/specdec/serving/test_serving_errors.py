"""Every failure a served request can meet has one kind, and bad input names its field."""

import asyncio

import pytest

from specdec.serving.async_engine import EngineClosedError
from specdec.requests.errors import WorkerError
from specdec.serving.serving_errors import (AdmissionError, DeadlineExceededError, ErrorKind, InvalidRequestError,
                                    NotFoundError, NotReadyError, classify, param_of)


@pytest.mark.parametrize("exc, kind", [
    (InvalidRequestError("prompt", "must not be empty"), ErrorKind.INVALID),
    (ValueError("top_p must be in (0, 1]"), ErrorKind.INVALID),
    (NotFoundError("no such model"), ErrorKind.NOT_FOUND),
    (AdmissionError("limit"), ErrorKind.OVERLOADED),
    (NotReadyError("loading"), ErrorKind.UNAVAILABLE),
    (EngineClosedError("shut down"), ErrorKind.UNAVAILABLE),
    (WorkerError("target down"), ErrorKind.UNAVAILABLE),
    (DeadlineExceededError("late"), ErrorKind.DEADLINE),
    (asyncio.TimeoutError(), ErrorKind.DEADLINE),
    (RuntimeError("boom"), ErrorKind.INTERNAL),
])
def test_each_failure_has_one_kind(exc, kind):
    assert classify(exc) is kind


@pytest.mark.parametrize("exc, param", [
    (InvalidRequestError("messages[0].role", "bad"), "messages[0].role"),
    (ValueError("top_p must be in (0, 1], got 2"), "top_p"),
    (ValueError("speculation.gamma 20 exceeds the limit 16"), "speculation.gamma"),
    (ValueError("stop: 20 stop strings exceed the limit 16"), "stop"),
    (ValueError("Something odd happened"), None),
])
def test_bad_input_names_its_field(exc, param):
    assert param_of(exc) == param
