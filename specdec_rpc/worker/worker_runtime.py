"""What the draft and target servicers share: serial blocking work, call statistics, error codes.

A worker holds one model and one slot cache, so its calls run one at a time: a servicer
takes `SerialExecutor.lock` for the whole call (history bookkeeping included) and runs the
torch work on the executor's single thread, off the gRPC event loop (a round call's short
model step runs on the loop itself: WorkerServicer._step).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from specdec.models.kv_cache import CacheFullError

logger = logging.getLogger(__name__)
T = TypeVar("T")


class SerialExecutor:
    """One worker thread for blocking (torch) work plus an asyncio lock that serialises calls."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock: asyncio.Lock | None = None

    @property
    def lock(self) -> asyncio.Lock:
        """Created lazily, so that it belongs to the event loop the server runs on."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the worker thread and await its result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class CallStats:
    """Batched calls served, sequences they carried, and the largest batch (WorkerInfo fields)."""

    calls: int = 0
    sequences: int = 0
    max_batch_size: int = 0

    def record(self, batch_size: int) -> None:
        self.calls += 1
        self.sequences += batch_size
        self.max_batch_size = max(self.max_batch_size, batch_size)


def info_as_dict(info: Any) -> dict[str, Any]:
    """A WorkerInfo message as a plain dict (field name -> value), for Ray callers and logs."""
    return {f.name: getattr(info, f.name) for f in info.DESCRIPTOR.fields}


class WorkerLost(RuntimeError):
    """Part of the worker is gone (a tensor-parallel rank died): it cannot serve until its
    supervisor re-forms it. Answered with UNAVAILABLE, so routers wait for the new one."""


class CallerGaveUp(RuntimeError):
    """The call's deadline passed before it ran (it waited for the worker's lock, or the
    worker was stopped): its caller went on without it, so it is not run at all."""


def check_caller_waits(context: grpc.aio.ServicerContext, method: str) -> None:
    """Raise CallerGaveUp when the call's deadline has passed: a late call must not change a
    worker's state after its caller moved on (the caller resyncs that state instead)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise CallerGaveUp(f"{method}: the caller's deadline passed {-remaining:.1f}s before the call could run")


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a worker answers an exception with."""
    if isinstance(exc, WorkerLost):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, CallerGaveUp):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, CacheFullError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL


class CallObserver(Protocol):
    """Told how each call ended (the worker's metrics, specdec_metrics.worker_metrics)."""

    def observe_call(self, rpc: str, code: str = "OK") -> None: ...


async def run_locked(
    work: SerialExecutor, context: grpc.aio.ServicerContext, method: str, fn: Callable[..., Awaitable[T]], *args: Any,
    calls: CallObserver | None = None,
) -> T:
    """Await fn(*args) under the worker's lock; a failure ends the call with its status. `calls`
    is told the status the call ends with (CANCELLED when the caller gave up, while it waited
    for the lock too)."""
    try:
        async with work.lock:
            try:
                result = await fn(*args)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status code
                error = exc
            else:
                if calls is not None:
                    calls.observe_call(method, "OK")
                return result
    except asyncio.CancelledError:
        if calls is not None:
            calls.observe_call(method, "CANCELLED")
        raise
    if calls is not None:
        calls.observe_call(method, status_code_for(error).name)
    await abort_with(context, method, error)
    raise AssertionError("unreachable: abort_with raises")


async def run_serially(
    work: SerialExecutor, context: grpc.aio.ServicerContext, method: str, fn: Callable[..., T], *args: Any,
    calls: CallObserver | None = None,
) -> T:
    """Run fn(*args) under the worker's lock on its thread; a failure ends the call with its status."""
    return await run_locked(work, context, method, work.run, fn, *args, calls=calls)


async def abort_with(context: grpc.aio.ServicerContext, method: str, exc: BaseException) -> None:
    """End the call with the status for `exc` (the message names the exception); never returns."""
    code = status_code_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        logger.exception("%s failed", method, exc_info=exc)
    await context.abort(code, f"{method}: {type(exc).__name__}: {exc}")
