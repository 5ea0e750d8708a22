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

Who reads the responses: a thread that waits for its call without a deadline of its own
(`result()`, as the target's verify does) reads the stream itself while nobody else does,
so its answer needs one thread wake-up (gRPC's poller to the caller), not two (to a reader
thread, then to the caller); a watchdog thread ends a stream whose call outlives its
timeout. The first wait with a deadline (the draft's round budget), callback or poll on a
stream starts a reader thread that reads it until it ends, so a late call still ends on its
own and no round waits beyond its budget.

Who answers the calls: with `parse` (the response message's parser), the stream hands gRPC a
response deserializer that parses each response and answers the oldest waiting call at once,
on gRPC's channel thread, where the response arrives; whoever reads the stream then only keeps
it read. So a call waited for with a deadline is answered without the reader thread's
wake-up in between (gRPC's thread to the waiting round thread directly).
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

from specdec.serving import after_send

logger = logging.getLogger(__name__)

_END = object()  # ends a stream's request iterator (gRPC's sending thread then closes its side)


def _requests(requests: queue.SimpleQueue) -> Iterator[Any]:
    """The stream's request iterator, read by gRPC's sending thread: it asks for the next
    request once the previous one is written, which is when work parked until the round's
    request is on its way runs (`after_send`: the previous round's hand-over)."""
    while (request := requests.get()) is not _END:
        yield request
        after_send.request_sent()


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
        self._opened: _Opened | None = None  # the stream it was sent on

    def _set(self, response: Any = None, error: grpc.RpcError | None = None) -> None:
        """(whoever reads the stream, or an expiry) The answer; later ones are ignored."""
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
        goes on), the call's RpcError when it failed or ran past its own timeout. Without a
        timeout the caller reads the stream itself while nobody else does."""
        if timeout is None:
            self._stream._read_for(self)
        else:
            self._stream._ensure_reader(self._opened)
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
        if not self._answered.is_set():
            self._stream._ensure_reader(self._opened)
            if time.monotonic() >= self._due:
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
                self._stream._ensure_reader(self._opened)
                return
        callback(self)

    def _expire(self) -> None:
        """Past its timeout: the worker is taken for hung, the stream ends (the next request opens another)."""
        self._set(error=StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "the worker did not answer in time"))
        self._stream.reset()


class _Opened:
    """One open stream: its gRPC call, the request queue, the calls waiting in order, whether
    someone (a caller or the reader thread) is reading its responses, and whether gRPC's
    deserializer answers the calls (`parsed`) or whoever reads them."""

    def __init__(self, grpc_call: Any, requests: queue.SimpleQueue, waiting: deque, parsed: bool) -> None:
        self.grpc_call, self.requests, self.waiting, self.parsed = grpc_call, requests, waiting, parsed
        self.responses = iter(grpc_call)
        self.reading = False


def _answering(parse: Callable[[bytes], Any], waiting: deque) -> Callable[[bytes], Any]:
    """A response deserializer for gRPC (it runs on gRPC's channel thread) that parses a response
    and answers the oldest call waiting on its stream with it. A response that does not parse,
    or that no request waits for, raises: gRPC then ends the stream (INTERNAL), which fails the
    calls still waiting on it."""

    def deserialize(data: bytes) -> Any:
        response = parse(data)
        try:
            call = waiting.popleft()
        except IndexError:
            raise StreamError(grpc.StatusCode.INTERNAL, "the worker answered more responses than requests") from None
        call._set(response)
        return response

    return deserialize


class RoundStream:
    """Requests of one kind to one worker over one stream, opened on the first request and
    again after the stream ended. Thread-safe (whoever reads answers the calls in order)."""

    def __init__(self, open_call: Callable[..., Any], timeout_s: float,
                 parse: Callable[[bytes], Any] | None = None) -> None:
        """open_call(requests) starts the stream-stream call over the request iterator
        (e.g. `lambda it: stub.VerifyStream(it)`, read again at every opening: a client that
        switched to another worker opens its next stream there); timeout_s: the longest a
        request may wait for its response; parse: the response message's parser (e.g.
        `VerifyResponse.FromString`); given, it is open_call(requests, deserialize), whose
        call must parse its responses with `deserialize` (gRPC's response_deserializer), which
        answers the calls as their responses arrive."""
        self._open_call = open_call
        self._parse = parse
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._open: _Opened | None = None
        self._stop: threading.Event | None = None  # the watchdog's, while it runs
        self.opened = 0  # streams opened so far

    def send(self, request: Any) -> StreamCall:
        """Send `request` (opening the stream if none is open); returns its call at once."""
        call = StreamCall(self, self.timeout_s)
        with self._lock:
            if self._open is not None and not self._open.waiting and self._open.grpc_call.done():
                self._open.requests.put(_END)  # it ended between rounds (the worker stopped), unread
                self._open = None
            if self._open is None:
                self._open = self._opening()
                self.opened += 1
            call._opened = self._open
            self._open.waiting.append(call)
            self._open.requests.put(request)
        return call

    def _opening(self) -> _Opened:
        """(under the lock) A new stream: its call, over a new request queue."""
        requests: queue.SimpleQueue = queue.SimpleQueue()
        waiting: deque[StreamCall] = deque()
        if self._parse is None:
            return _Opened(self._open_call(_requests(requests)), requests, waiting, parsed=False)
        grpc_call = self._open_call(_requests(requests), _answering(self._parse, waiting))
        return _Opened(grpc_call, requests, waiting, parsed=True)

    def _read_for(self, call: StreamCall) -> None:
        """(a caller without a deadline) Read responses until `call` is answered, while no one
        else reads; when someone does, return (the caller waits for its answer)."""
        opened = call._opened
        if opened is None or not self._take_reading(opened):
            return
        self._watch()
        try:
            while not call._answered.is_set() and self._read_one(opened):
                pass
        finally:
            self._drop_reading(opened)

    def _ensure_reader(self, opened: _Opened | None) -> None:
        """Make sure someone reads `opened` while calls wait on it (a reader thread if nobody does)."""
        if opened is not None and self._take_reading(opened):
            self._drop_reading(opened)

    def _take_reading(self, opened: _Opened) -> bool:
        with self._lock:
            if opened.reading or not opened.waiting:
                return False
            opened.reading = True
            return True

    def _drop_reading(self, opened: _Opened) -> None:
        """Stop reading; while calls still wait on an open stream, a reader thread goes on."""
        with self._lock:
            if not (opened.waiting and self._open is opened):
                opened.reading = False
                return
        threading.Thread(target=self._reader, args=(opened,), name="round-stream", daemon=True).start()

    def _reader(self, opened: _Opened) -> None:
        """(reader thread, holding the reading for good) Answer the waiting calls in order until
        the stream ends: a stream whose calls wait with deadlines keeps its reader, as starting
        one per call would cost more than the hand-off it saves."""
        while self._read_one(opened):
            pass

    def _read_one(self, opened: _Opened) -> bool:
        """(whoever reads) Answer the oldest waiting call with the next response; False when the
        stream ended (then every call still waiting on it has failed)."""
        try:
            response = next(opened.responses)
        except StopIteration:
            error: grpc.RpcError = StreamError(grpc.StatusCode.UNAVAILABLE, "the worker ended the stream")
        except grpc.RpcError as exc:
            error = exc
            if exc.code() == grpc.StatusCode.CANCELLED:  # not by this side: the worker stopped its streams
                error = StreamError(grpc.StatusCode.UNAVAILABLE, f"the worker ended the stream ({exc.details()})")
        else:
            if opened.parsed:  # gRPC's deserializer answered its call already
                return True
            try:
                call = opened.waiting.popleft()
            except IndexError:  # a response no request waits for: the worker broke the protocol
                error = StreamError(grpc.StatusCode.INTERNAL, "the worker answered more responses than requests")
                opened.grpc_call.cancel()
            else:
                call._set(response)
                return True
        self._ended(opened, error)
        return False

    def _ended(self, opened: _Opened, error: grpc.RpcError) -> None:
        with self._lock:
            if self._open is opened:
                self._open = None
        opened.requests.put(_END)
        _fail_all(opened.waiting, error)

    def _watch(self) -> None:
        """Start the watchdog (once): a caller reading the stream cannot time its own read out."""
        with self._lock:
            if self._stop is not None:
                return
            self._stop = threading.Event()
        threading.Thread(target=self._watchdog, args=(self._stop,), name="round-stream-watchdog",
                         daemon=True).start()

    def _watchdog(self, stop: threading.Event) -> None:
        """Fail the oldest waiting call once past its timeout (which ends the stream). Sleeps
        until that call's due, or timeout_s while none waits: a call sent meanwhile is due
        after the wake-up, so nothing needs to wake it."""
        wait = self.timeout_s
        while not stop.wait(wait):
            with self._lock:
                oldest = self._open.waiting[0] if self._open is not None and self._open.waiting else None
            if oldest is not None and time.monotonic() >= oldest._due:
                oldest.done()
                continue
            wait = self.timeout_s if oldest is None else oldest._due - time.monotonic()

    def reset(self) -> None:
        """End the open stream (its waiting calls fail); the next request opens a new one."""
        with self._lock:
            opened, self._open = self._open, None
        if opened is not None:
            opened.requests.put(_END)
            opened.grpc_call.cancel()
            _fail_all(opened.waiting, StreamError(grpc.StatusCode.CANCELLED, "the stream was reset"))

    def close(self) -> None:
        """End the open stream and stop the watchdog."""
        self.reset()
        with self._lock:
            stop, self._stop = self._stop, None
        if stop is not None:
            stop.set()


def _fail_all(waiting: deque, error: grpc.RpcError) -> None:
    """Answer every call still waiting with `error` (the reader and a reset may both empty the queue)."""
    while True:
        try:
            call = waiting.popleft()
        except IndexError:
            return
        call._set(error=error)
