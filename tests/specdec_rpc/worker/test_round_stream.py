"""RoundStream: requests on one persistent stream are answered in order, each as a future; a
late answer still ends its call; a call past its timeout fails with DEADLINE_EXCEEDED and the
next request opens a new stream; a stream that fails fails the requests waiting on it. A caller
that waits without a deadline reads the stream itself; a wait with one leaves it to a reader
thread, so it returns at its deadline."""

from __future__ import annotations

import threading

import grpc
import pytest

from specdec_rpc.worker.round_stream import RoundStream, StreamError


class Worker:
    """A fake stream-stream call: answers each request n with n + 1 once `release` allows,
    or fails the stream with `fail` (an RpcError) when a request is -1; a cancelled call's
    reader gets CANCELLED (as gRPC's). `readers` names the thread that read each response."""

    def __init__(self) -> None:
        self.release = threading.Semaphore(1000)
        self.cancelled = 0
        self.readers: list[str] = []
        self.ended = False  # the call's status arrived (gRPC's done()), e.g. the worker stopped

    def open(self, requests):
        worker = self
        cancelled = threading.Event()

        class Call:
            def __iter__(self):
                for n in requests:
                    while not worker.release.acquire(timeout=0.01):
                        if cancelled.is_set():
                            raise StreamError(grpc.StatusCode.CANCELLED, "cancelled")
                    if n == -1:
                        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
                    worker.readers.append(threading.current_thread().name)
                    yield n + 1

            def cancel(self):
                worker.cancelled += 1
                cancelled.set()

            def done(self):
                return worker.ended


        return Call()


class QueuedCall:
    """A fake stream-stream call whose responses a thread of the test puts on a queue; its
    reader waits for `readable` (when given) before each one."""

    def __init__(self, responses, readable: threading.Event | None = None) -> None:
        self.responses, self.readable = responses, readable

    def __iter__(self):
        while True:
            if self.readable is not None:
                self.readable.wait()
            yield self.responses.get()

    def cancel(self):
        pass

    def done(self):
        return False


def test_requests_are_answered_in_order_on_one_stream():
    worker = Worker()
    stream = RoundStream(worker.open, timeout_s=5.0)
    calls = [stream.send(n) for n in range(5)]
    assert [c.result() for c in calls] == [1, 2, 3, 4, 5]
    assert stream.opened == 1
    stream.close()


def late_call(n: int) -> tuple[Worker, RoundStream, object]:
    """A worker that answers nothing yet, its stream, and a call of `n` that missed a 50 ms wait
    (a reader thread now reads for it)."""
    worker = Worker()
    worker.release = threading.Semaphore(0)
    stream = RoundStream(worker.open, timeout_s=5.0)
    late = stream.send(n)
    with pytest.raises(grpc.FutureTimeoutError):
        late.result(timeout=0.05)
    return worker, stream, late


def test_a_late_answer_ends_its_call_and_the_stream_goes_on():
    worker, stream, late = late_call(10)
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


def test_a_caller_without_a_deadline_reads_the_stream_itself():
    worker = Worker()
    stream = RoundStream(worker.open, timeout_s=5.0)
    assert [stream.send(n).result() for n in range(3)] == [1, 2, 3]
    assert worker.readers == [threading.current_thread().name] * 3
    stream.close()


def test_a_wait_with_a_deadline_returns_at_it_and_a_blocking_caller_gets_its_answer_after_the_late_one():
    worker, stream, late = late_call(1)
    blocking = stream.send(2)
    worker.release.release(2)
    assert blocking.result() == 3 and late.result() == 2
    assert worker.readers[0] == "round-stream"
    stream.close()


def test_a_stream_that_ended_between_rounds_is_not_used_again():
    worker = Worker()
    stream = RoundStream(worker.open, timeout_s=5.0)
    assert stream.send(1).result() == 2
    worker.ended = True  # the worker stopped: the status arrived while nobody read the stream
    call = stream.send(2)
    worker.ended = False
    assert call.result() == 3 and stream.opened == 2
    stream.close()


def test_the_sending_side_runs_parked_work_once_a_request_was_written_and_the_next_asked_for():
    """As gRPC's: a sending thread consumes the request iterator, a response per request."""
    import queue

    from specdec.serving import after_send

    written, ran_after = [], []

    def open_call(requests):
        responses: queue.SimpleQueue = queue.SimpleQueue()

        def send():
            for n in requests:
                written.append(n)
                responses.put(n + 1)

        threading.Thread(target=send, daemon=True).start()
        return QueuedCall(responses)

    stream = RoundStream(open_call, timeout_s=5.0)
    after_send.park(lambda: ran_after.append(list(written)))
    assert stream.send(1).result() == 2
    stream.send(2).result()
    assert ran_after == [[1]], "it ran once, after request 1 was written and before request 2"
    stream.close()


def test_with_a_parser_each_call_is_answered_where_its_response_is_parsed():
    """gRPC's channel thread parses each response (the call's response_deserializer) and answers
    its call there: a call waited for with a deadline needs no reader thread's wake-up (the
    reader, held back here, only keeps the stream read)."""
    import queue

    parsed_on, read = [], threading.Event()

    def open_call(requests, deserialize):
        responses: queue.SimpleQueue = queue.SimpleQueue()

        def channel():  # as gRPC's channel thread: each response parsed as it arrives
            for n in requests:
                parsed_on.append(threading.current_thread().name)
                responses.put(deserialize(str(n + 1).encode()))

        threading.Thread(target=channel, name="channel", daemon=True).start()
        return QueuedCall(responses, read)

    stream = RoundStream(open_call, timeout_s=5.0, parse=int)
    assert stream.send(1).result(timeout=2.0) == 2, "answered though nobody has read the stream"
    read.set()
    assert stream.send(2).result() == 3
    assert parsed_on == ["channel", "channel"]
    stream.close()


def test_a_parsed_response_no_request_waits_for_fails_the_stream():
    """The deserializer raises: gRPC then ends the stream (INTERNAL), failing its waiting calls."""
    from collections import deque

    from specdec_rpc.worker.round_stream import _answering

    with pytest.raises(StreamError) as raised:
        _answering(int, deque())(b"1")
    assert raised.value.code() == grpc.StatusCode.INTERNAL
