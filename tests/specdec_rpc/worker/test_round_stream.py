"""RoundStream: requests on one persistent stream are answered in order, each as a future; a
late answer still ends its call; a call past its timeout fails with DEADLINE_EXCEEDED and the
next request opens a new stream; a stream that fails fails the requests waiting on it."""

from __future__ import annotations

import threading

import grpc
import pytest

from specdec_rpc.worker.round_stream import RoundStream, StreamError


class Worker:
    """A fake stream-stream call: answers each request n with n + 1 once `release` allows,
    or fails the stream with `fail` (an RpcError) when a request is -1."""

    def __init__(self) -> None:
        self.release = threading.Semaphore(1000)
        self.cancelled = 0

    def open(self, requests):
        worker = self

        class Call:
            def __iter__(self):
                for n in requests:
                    worker.release.acquire()
                    if n == -1:
                        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
                    yield n + 1

            def cancel(self):
                worker.cancelled += 1

        return Call()


def test_requests_are_answered_in_order_on_one_stream():
    worker = Worker()
    stream = RoundStream(worker.open, timeout_s=5.0)
    calls = [stream.send(n) for n in range(5)]
    assert [c.result() for c in calls] == [1, 2, 3, 4, 5]
    assert stream.opened == 1
    stream.close()


def test_a_late_answer_ends_its_call_and_the_stream_goes_on():
    worker = Worker()
    worker.release = threading.Semaphore(0)
    stream = RoundStream(worker.open, timeout_s=5.0)
    late = stream.send(10)
    with pytest.raises(grpc.FutureTimeoutError):
        late.result(timeout=0.05)
    ended = threading.Event()
    late.add_done_callback(lambda call: ended.set())
    assert not late.done()
    worker.release.release(2)
    assert ended.wait(2.0) and late.result() == 11
    assert stream.send(20).result() == 21 and stream.opened == 1
    stream.close()


def test_a_call_past_its_timeout_fails_and_the_next_request_opens_a_new_stream():
    worker = Worker()
    worker.release = threading.Semaphore(0)
    stream = RoundStream(worker.open, timeout_s=0.1)
    with pytest.raises(grpc.RpcError) as failed:
        stream.send(1).result()
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and worker.cancelled == 1
    worker.release.release(10)
    assert stream.send(2).result() == 3 and stream.opened == 2
    stream.close()


def test_a_failed_stream_fails_the_waiting_requests_and_a_new_one_serves_the_next():
    worker = Worker()
    stream = RoundStream(worker.open, timeout_s=5.0)
    with pytest.raises(grpc.RpcError) as failed:
        stream.send(-1).result()
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stream.send(4).result() == 5 and stream.opened == 2
    stream.close()
