"""What the servicers share: a call whose caller gave up is not run, and says so with DEADLINE_EXCEEDED."""

from __future__ import annotations

import grpc
import pytest

from specdec_rpc.worker.worker_runtime import CallerGaveUp, check_caller_waits, status_code_for


class Context:
    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


@pytest.mark.parametrize("remaining", [0.0, -3.0])
def test_a_call_whose_deadline_passed_is_refused_as_deadline_exceeded(remaining):
    with pytest.raises(CallerGaveUp, match="Propose: the caller's deadline passed") as refused:
        check_caller_waits(Context(remaining), "Propose")
    assert status_code_for(refused.value) == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("remaining", [None, 0.5])
def test_a_call_without_a_deadline_or_with_time_left_runs(remaining):
    check_caller_waits(Context(remaining), "Propose")
