"""AsyncEngine: one thread runs the SpeculativeEngine's rounds; asyncio callers stream from it.

Continuous batching at round granularity: the loop thread owns the engine and runs one
round after another while any request is waiting or running. A submitted request joins at
the next round, a finished one leaves (its cache slots are freed on the target and the
proposer), and each round's confirmed tokens are handed to the request's asyncio consumer
as soon as the round ends (`OutputHandoff`: one wake-up per caller's event loop per round).

Threading rule: only the loop thread touches the engine. Callers send commands (add,
abort, stop) through a thread-safe queue; the loop hands results back to each caller's
event loop with one `loop.call_soon_threadsafe` per round. A request that fails alone (the engine
isolates it) ends with its own error; a round that raises (a WorkerError: no row caused
it) fails the requests it was running, whose slots are freed, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec.round.engine import SpeculativeEngine
from specdec.serving import after_send
from specdec.serving.output_handoff import OutputHandoff, hand_over
from specdec.round.round_output import GenerationResult, RoundOutput
from specdec.requests.request import GenerationRequest

logger = logging.getLogger(__name__)


class AdmissionError(RuntimeError):
    """The admission limit (running + waiting requests) is reached; retry later."""


class EngineClosedError(RuntimeError):
    """The engine loop was shut down before the request finished."""


class RequestStream:
    """One submitted request: `async for` its RoundOutputs, then `await result()`.

    Closing it early (`aclose()`, leaving `async with`, or cancelling the task that awaits
    it) aborts the request, which frees its cache slots. A round failure is raised from the
    iteration (or from `result()`) with the original exception.
    """

    def __init__(self, owner: "AsyncEngine", seq_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.seq_id = seq_id
        self._owner = owner
        self.loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._result: GenerationResult | None = None
        self._done = False

    def receive(self, item: Any) -> None:
        """On the caller's event loop (handed over by the loop thread); a closed stream's
        items are dropped: its request is aborted, nobody reads them."""
        if not self._done:
            self._queue.put_nowait(item)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RoundOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:  # cancelled consumer (asyncio.CancelledError) and the like
            self._abort()
            raise
        if isinstance(item, RoundOutput):
            return item
        self._done = True
        if isinstance(item, BaseException):
            raise item
        self._result = item
        raise StopAsyncIteration

    async def result(self) -> GenerationResult:
        """Wait for the end of the request (consuming the remaining outputs) and return it."""
        async for _ in self:
            pass
        if self._result is None:
            raise EngineClosedError(f"request {self.seq_id} ended without a result")
        return self._result

    def _abort(self) -> None:
        if not self._done:
            self._done = True
            self._owner._send(_Command("abort", self.seq_id))

    async def aclose(self) -> None:
        """Stop consuming: aborts the request when it has not finished yet."""
        self._abort()

    async def __aenter__(self) -> "RequestStream":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._abort()

    def __del__(self) -> None:  # a forgotten stream must not hold cache slots
        if not getattr(self, "_done", True):
            self._owner._send(_Command("abort", self.seq_id))


@dataclass
class _Command:
    kind: str  # "add" | "abort" | "stop"
    seq_id: str = ""
    request: GenerationRequest | None = None
    stream: RequestStream | None = None


class AsyncEngine:
    """Drives a SpeculativeEngine from a background thread for asyncio callers."""

    def __init__(
        self,
        engine: SpeculativeEngine,
        max_concurrent_requests: int = 64,
        on_idle: Callable[[], None] | None = None,
        name: str = "specdec-engine-loop",
        defer_handoff: bool = False,
    ) -> None:
        """on_idle: called on the loop thread whenever it runs out of work after doing some
        (e.g. to send releases that remote workers buffer until their next call).
        defer_handoff: hand a round's outputs over once the next round's first request to a
        worker is written (`after_send`), off the round's critical path; only for engines
        whose every round sends on a round stream (else at the next round's end)."""
        if max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {max_concurrent_requests}")
        self.engine = engine
        self.max_concurrent_requests = max_concurrent_requests
        self._on_idle = on_idle
        self._worked = False  # something happened since on_idle last ran
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # owned by the loop thread
        self._handoff = OutputHandoff(self._lost)  # items for the streams, until the round's end
        self._defer_handoff = defer_handoff
        self._parked: after_send.Once | None = None  # the last round's hand-over, while parked
        self._lost_parked: list[RequestStream] = []  # streams found lost by a parked hand-over
        self._admitted: set[str] = set()  # guarded by _lock: submitted and not yet ended
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- caller side (any thread with a running event loop) -------------------------------

    @property
    def is_running(self) -> bool:
        """The loop thread is alive and accepts requests."""
        return self._thread.is_alive() and not self._closed

    @property
    def num_requests(self) -> int:
        """Requests admitted and not yet finished (running + waiting)."""
        with self._lock:
            return len(self._admitted)

    def submit(self, request: GenerationRequest, seq_id: str | None = None) -> RequestStream:
        """Queue a request (it joins at the next round) and return its stream.

        Raises ValueError (naming the field) for a request the models cannot serve,
        AdmissionError when max_concurrent_requests are already admitted, and
        EngineClosedError after shutdown(). Must be called from a running event loop.
        """
        loop = asyncio.get_running_loop()
        self.engine.validate(request)
        seq_id = seq_id if seq_id is not None else f"req-{next(self._ids)}"
        with self._lock:
            if self._closed:
                raise EngineClosedError("the engine loop is shut down")
            if seq_id in self._admitted:
                raise ValueError(f"seq_id {seq_id!r} is already in use")
            if len(self._admitted) >= self.max_concurrent_requests:
                raise AdmissionError(
                    f"admission limit reached: {len(self._admitted)} requests running or waiting "
                    f"(max_concurrent_requests={self.max_concurrent_requests}); retry later"
                )
            self._admitted.add(seq_id)
            stream = RequestStream(self, seq_id, loop)
            self._send(_Command("add", seq_id, request, stream))  # under the lock: before any "stop"
        return stream

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one request to completion (cancelling the awaiting task aborts it)."""
        stream = self.submit(request)
        async with stream:
            return await stream.result()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the loop: unfinished requests are aborted and fail with EngineClosedError."""
        with self._lock:
            self._closed = True
        self._send(_Command("stop"))
        self._thread.join(timeout_s)

    def _send(self, command: _Command) -> None:
        self._commands.put(command)

    # ---- loop thread -----------------------------------------------------------------------

    def _run(self) -> None:
        """Apply commands; run a round whenever there is work; block when idle."""
        while True:
            block = not self.engine.has_unfinished()
            if block:
                self._flush()  # e.g. a failed add's error
                if self._worked:
                    self._idle()
            try:
                while True:
                    command = self._commands.get(block=block)
                    block = False
                    if not self._apply(command):
                        self._close_all()
                        self._flush()
                        self._idle()
                        return
            except queue.Empty:
                pass
            if self.engine.has_unfinished():
                self._round()

    def _idle(self) -> None:
        self._worked = False
        if self._on_idle is not None:
            try:
                self._on_idle()
            except Exception:
                logger.exception("on_idle failed")

    def _apply(self, command: _Command) -> bool:
        """Apply one command on the loop thread; False means stop."""
        self._worked = True
        if command.kind == "stop":
            return False
        if command.kind == "add":
            assert command.request is not None and command.stream is not None
            try:
                self.engine.add_request(command.request, command.seq_id)
            except Exception as exc:  # validated in submit(); anything else fails this request only
                self._end(command.stream, exc)
                return True
            self._streams[command.seq_id] = command.stream
        elif command.kind == "abort":
            stream = self._streams.pop(command.seq_id, None)
            if stream is not None:
                self._drop(command.seq_id)
                self._forget(command.seq_id)
        return True

    def _round(self) -> None:
        """One engine step; hand each output to its stream, end finished ones: one wake-up
        per event loop for all of them."""
        self._worked = True
        self._drop_lost_parked()
        try:
            outputs = self.engine.step()
        except Exception as exc:
            logger.exception("round failed; failing the requests it was running")
            # the round's batch; when it failed before forming one (e.g. the target is
            # unreachable while admitting), every waiting request is affected
            self._fail(self.engine.running_ids() or list(self._streams), exc)
            self._flush()
            return
        for output in outputs:
            stream = self._streams.get(output.seq_id)
            if stream is None:
                continue
            if output.error is not None:
                del self._streams[output.seq_id]
                self._drop(output.seq_id)
                self._end(stream, output.error)
                continue
            if output.new_token_ids or output.finish_reason:
                self._handoff.keep(stream, output)
            if output.finish_reason is not None and self._streams.pop(output.seq_id, None) is not None:
                self._end(stream, self.engine.result(output.seq_id))
        if self._defer_handoff:
            self._park()
        else:
            self._flush()

    def _flush(self) -> None:
        """Hand over what is kept now (a parked hand-over first: each stream's items stay in order)."""
        self._unpark()
        self._handoff.flush()
        self._drop_lost_parked()

    def _park(self) -> None:
        """Hand this round's items over once the next round's first request is written
        (`after_send`), or at the next `_flush` / `_park`, whichever comes first."""
        self._unpark()
        kept = self._handoff.take()
        if kept:
            self._parked = after_send.park(lambda: hand_over(kept, self._lost_parked.append))

    def _unpark(self) -> None:
        """Run the parked hand-over now unless a sending thread already did (it waits for one running)."""
        parked, self._parked = self._parked, None
        if parked is not None:
            parked()

    def _drop_lost_parked(self) -> None:
        """(the loop thread) Drop the streams a parked hand-over found lost (their loop closed)."""
        while self._lost_parked:
            self._lost(self._lost_parked.pop(0))

    def _fail(self, seq_ids: list[str], exc: BaseException) -> None:
        for seq_id in seq_ids:
            self._drop(seq_id)
            stream = self._streams.pop(seq_id, None)
            if stream is not None:
                self._end(stream, exc)

    def _close_all(self) -> None:
        self._fail(list(self._streams), EngineClosedError("the engine loop was shut down"))

    def _drop(self, seq_id: str) -> None:
        """Abort a sequence (frees its slots on both sides) and forget its result."""
        try:
            self.engine.abort(seq_id)
        except KeyError:
            pass  # already finished
        except Exception:
            logger.exception("releasing %s failed", seq_id)
        try:
            self.engine.result(seq_id)
        except KeyError:
            pass
        except Exception:  # noqa: BLE001 - the request's own error, already handed over
            pass

    def _end(self, stream: RequestStream, item: GenerationResult | BaseException) -> None:
        self._forget(stream.seq_id)  # first: a caller that sees the end may submit again
        self._handoff.keep(stream, item)

    def _forget(self, seq_id: str) -> None:
        with self._lock:
            self._admitted.discard(seq_id)

    def _lost(self, stream: RequestStream) -> None:
        """The stream's event loop is closed: nobody listens any more (its result goes too)."""
        if self._streams.get(stream.seq_id) is stream:
            del self._streams[stream.seq_id]
            self._drop(stream.seq_id)
            self._forget(stream.seq_id)
