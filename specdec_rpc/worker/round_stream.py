"""RoundStream: one persistent bidirectional stream from a router's client to a worker, carrying
the round calls (ProposeStream / VerifyStream) that would otherwise be one unary call each.

A unary call pays its setup every round on both ends (a new HTTP/2 stream, metadata, the
server's call object and task); on the stream a round's request is one message each way
(docs/emulated_devices.md has the measurements). The worker answers each request as the
unary call would, one response per request, in order, so the responses are matched to the
requests by their order.

Each request is a `StreamCall`, the part of a grpc.Future the clients use (result with a
timeout, done, exception, add_done_callback), so a draft call that misses its round's
deadline is left to end on its own exactly as a unary future is. A call that runs longer
than `timeout_s` fails with DEADLINE_EXCEEDED and ends the stream (its worker is taken for
hung). A stream that ends (the worker failed a request with its status, went down, or
stopped) fails every request still waiting on it; the next request opens a new stream.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import grpc

logger = logging.getLogger(__name__)

_END = object()  # ends a stream's request iterator (gRPC's sending thread then closes its side)


class StreamError(grpc.RpcError):
    """A request on a stream that ended without its answer (the RpcError interface: code, details)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class StreamCall:
    """One request on a RoundStream, answered once (a response or an RpcError)."""

    def __init__(self, stream: "RoundStream", timeout_s: float) -> None:
        self._stream = stream
        self._due = time.monotonic() + timeout_s  # the longest the call may run (the unary call's timeout)
        self._answered = threading.Event()
        self._response: Any = None
        self._error: grpc.RpcError | None = None
        self._callbacks: list[Callable[["StreamCall"], None]] = []
        self._lock = threading.Lock()

    def _set(self, response: Any = None, error: grpc.RpcError | None = None) -> None:
        """(the stream's reader thread, or an expiry) The answer; later ones are ignored."""
        with self._lock:
            if self._answered.is_set():
                return
            self._response, self._error = response, error
            self._answered.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def result(self, timeout: float | None = None) -> Any:
        """The response; raises grpc.FutureTimeoutError when `timeout` passes first (the call
        goes on), the call's RpcError when it failed or ran past its own timeout."""
        wait = self._due - time.monotonic() if timeout is None else min(timeout, self._due - time.monotonic())
        if not self._answered.wait(max(0.0, wait)):
            if timeout is not None and time.monotonic() < self._due:
                raise grpc.FutureTimeoutError()
            self._expire()
        if self._error is not None:
            raise self._error
        return self._response

    def done(self) -> bool:
        """True once answered (or past its own timeout: then it fails, and its stream ends)."""
        if not self._answered.is_set() and time.monotonic() >= self._due:
            self._expire()
        return self._answered.is_set()

    def cancelled(self) -> bool:
        return False

    def exception(self, timeout: float | None = None) -> grpc.RpcError | None:
        try:
            self.result(timeout)
        except grpc.RpcError as exc:
            return exc
        return None

    def add_done_callback(self, callback: Callable[["StreamCall"], None]) -> None:
        with self._lock:
            if not self._answered.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def _expire(self) -> None:
        """Past its timeout: the worker is taken for hung, the stream ends (the next request opens another)."""
        self._set(error=StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "the worker did not answer in time"))
        self._stream.reset()


class RoundStream:
    """Requests of one kind to one worker over one stream, opened on the first request and
    again after the stream ended. Thread-safe (the reader thread answers the calls)."""

    def __init__(self, open_call: Callable[[Iterator], Any], timeout_s: float) -> None:
        """open_call(requests) starts the stream-stream call over the request iterator
        (e.g. `lambda it: stub.VerifyStream(it)`, read again at every opening: a client that
        switched to another worker opens its next stream there); timeout_s: the longest a
        request may wait for its response."""
        self._open_call = open_call
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._open: tuple[Any, queue.SimpleQueue, deque] | None = None  # (call, requests, waiting calls)
        self.opened = 0  # streams opened so far

    def send(self, request: Any) -> StreamCall:
        """Send `request` (opening the stream if none is open); returns its call at once."""
        call = StreamCall(self, self.timeout_s)
        with self._lock:
            if self._open is None:
                self._open = self._start()
            _, requests, waiting = self._open
            waiting.append(call)
            requests.put(request)
        return call

    def _start(self) -> tuple[Any, queue.SimpleQueue, deque]:
        requests: queue.SimpleQueue = queue.SimpleQueue()
        waiting: deque = deque()
        grpc_call = self._open_call(iter(requests.get, _END))
        opened = (grpc_call, requests, waiting)
        threading.Thread(target=self._read, args=(opened,), name="round-stream", daemon=True).start()
        self.opened += 1
        return opened

    def _read(self, opened: tuple[Any, queue.SimpleQueue, deque]) -> None:
        """(reader thread) Answer the waiting calls in order, until the stream ends; then fail the rest."""
        grpc_call, requests, waiting = opened
        try:
            for response in grpc_call:
                waiting.popleft()._set(response)
            error: grpc.RpcError = StreamError(grpc.StatusCode.UNAVAILABLE, "the worker ended the stream")
        except grpc.RpcError as exc:
            error = exc
            if exc.code() == grpc.StatusCode.CANCELLED:  # not by this side: the worker stopped its streams
                error = StreamError(grpc.StatusCode.UNAVAILABLE, f"the worker ended the stream ({exc.details()})")
        except IndexError:  # a response no request waits for: the worker broke the protocol
            error = StreamError(grpc.StatusCode.INTERNAL, "the worker answered more responses than requests")
            grpc_call.cancel()
        with self._lock:
            if self._open is opened:
                self._open = None
        requests.put(_END)
        _fail_all(waiting, error)

    def reset(self) -> None:
        """End the open stream (its waiting calls fail); the next request opens a new one."""
        with self._lock:
            opened, self._open = self._open, None
        if opened is not None:
            grpc_call, requests, waiting = opened
            requests.put(_END)
            grpc_call.cancel()
            _fail_all(waiting, StreamError(grpc.StatusCode.CANCELLED, "the stream was reset"))

    close = reset


def _fail_all(waiting: deque, error: grpc.RpcError) -> None:
    """Answer every call still waiting with `error` (the reader and a reset may both empty the queue)."""
    while True:
        try:
            call = waiting.popleft()
        except IndexError:
            return
        call._set(error=error)
