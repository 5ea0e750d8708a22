"""WorkerServicer: what the draft and target gRPC services share: leases, release and health.

A worker (DraftServicer, TargetServicer) serves one model; its calls run one at a time
(SerialExecutor's lock), a round call's short model step on the event loop and any longer
one (a prefill) on the worker thread (`_step`). It rebuilds each sequence's history from the router's deltas
(HistoryStore) and holds every sequence under its router's lease (LeaseReaper): a router that
stops renewing it loses its slots. This base holds that lifecycle once: start/close, the
Release, GetInfo and KeepAlive calls, and the gauges of its WorkerMetrics (none recorded
unless the actor passes real ones). A subclass adds its round call (Propose or Verify), frees
its model's state of one sequence (`_free`), and says what it serves (`info`) and how full
it is (`state`). Its round call is served as a unary call and over a router's persistent
stream (`_serve_stream`: each request as the unary call would be, in order), and frees the
sequences the router released since its last call first (`release_seq_ids`: no Release
call of their own on the round's path).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from specdec_rpc.worker.history_sync import HistoryStore, SamplingDecoder
from specdec_rpc.worker.lease_reaper import LeaseReaper
from specdec_rpc.v1 import worker_pb2
from specdec_rpc.worker.worker_runtime import CallStats, SerialExecutor, run_serially


#: a round call's model step with at most this many new tokens (history deltas and drafts to
#: verify: a decode round, not a long prefill) runs on the event loop itself (`_step`)
INLINE_MAX_TOKENS = 256


class WorkerServicer:
    """The lifecycle of one worker service (mixed in before the generated gRPC servicer base)."""

    inline_steps = True  # short model steps may run on the event loop (`_step`)

    def __init__(self, thread_name: str, lease_ttl_s: float, metrics: WorkerMetrics) -> None:
        """thread_name: the worker thread's name; lease_ttl_s: how long a silent router's
        sequences are held; metrics: where calls, compute and cache use are recorded."""
        self.histories = HistoryStore()
        self.sampling = SamplingDecoder()  # each request's params validated once, not every round
        self.stats = CallStats()
        self._work = SerialExecutor(thread_name)
        self.leases = LeaseReaper(lease_ttl_s, self._work, self._release)
        self.metrics = metrics
        self._metrics_task = None
        self._streams: set[asyncio.Task] = set()  # the handlers of open round streams

    def start(self) -> None:
        """On the server's event loop: start freeing the slots of lapsed leases and updating the
        cache and lease gauges."""
        self.leases.start()
        if self._metrics_task is None:
            self._metrics_task = self.metrics.poll(self.state)

    def state(self) -> WorkerState:
        """The cache and leases now (read on the event loop, which owns the lease table)."""
        raise NotImplementedError

    def info(self) -> worker_pb2.WorkerInfo:
        """What this worker serves and its counters (the GetInfo reply)."""
        raise NotImplementedError

    def _info(self, **fields) -> worker_pb2.WorkerInfo:
        """A WorkerInfo of the given fields plus the call counters and the lease figures."""
        return worker_pb2.WorkerInfo(
            calls=self.stats.calls,
            sequences=self.stats.sequences,
            max_batch_size=self.stats.max_batch_size,
            **fields,
            **self.leases.info_fields(),
        )

    def _free(self, seq_id: str) -> None:
        """Free the model's state (cache slot) of one sequence (on the worker thread, or in a short model step)."""
        raise NotImplementedError

    async def Release(self, request: worker_pb2.ReleaseRequest, context: grpc.aio.ServicerContext):
        with self.leases.call(request.lease_id):
            await run_serially(self._work, context, "Release", self._release, list(request.seq_ids), calls=self.metrics)
        self.leases.released(request.seq_ids)
        return worker_pb2.ReleaseResponse()

    async def _step(self, new_tokens: int, fn: Callable[..., Any], *args: Any) -> Any:
        """A round call's model step fn(*args), under the worker's lock: a short one (at most
        INLINE_MAX_TOKENS new tokens) on the event loop itself, which saves the round two
        thread hand-offs; a longer one (a prefill) on the worker thread, so that KeepAlive and
        the lease reaper never wait for a long step."""
        if self.inline_steps and new_tokens <= INLINE_MAX_TOKENS:
            return fn(*args)
        return await self._work.run(fn, *args)

    def _forget_released(self, seq_ids) -> None:
        """On the event loop, under the worker's lock: a round call's `release_seq_ids` leave the
        history store and the lease table before the call's deltas are applied; their model state
        is freed first in the call's model step (`_free_released`)."""
        if seq_ids:
            for seq_id in seq_ids:
                self.histories.release(seq_id)
            self.leases.released(seq_ids)

    def _free_released(self, seq_ids) -> None:
        """First in a round call's model step: free the model state of its `release_seq_ids`
        (their slots serve the call's new sequences)."""
        for seq_id in seq_ids:
            self._free(seq_id)

    def _release(self, seq_ids: list[str]) -> None:
        """On the worker thread: forget the sequences (a Release, or their lease lapsed)."""
        for seq_id in seq_ids:
            self._free(seq_id)
            self.histories.release(seq_id)

    async def GetInfo(self, request: worker_pb2.InfoRequest, context: grpc.aio.ServicerContext):
        self.metrics.observe_call("GetInfo")
        return self.info()

    async def KeepAlive(self, request: worker_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext):
        held = self.leases.keep_alive(request.lease_id)
        self.metrics.observe_call("KeepAlive")
        return worker_pb2.KeepAliveResponse(lease_ttl_s=self.leases.ttl_s, held_sequences=held)

    async def _serve_stream(self, requests: AsyncIterator, context: grpc.aio.ServicerContext,
                            call: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]) -> AsyncIterator:
        """A round stream (ProposeStream, VerifyStream): each request answered by `call` (the
        unary handler) in order; a request that fails ends the stream with its status."""
        task = asyncio.current_task()
        self._streams.add(task)
        try:
            async for request in requests:
                yield await call(request, context)
        finally:
            self._streams.discard(task)

    def end_streams(self) -> None:
        """On the server's event loop, when it stops: end the open round streams (their routers
        see the worker gone and open new streams to wherever it serves next), so that no stream
        holds the server's stop for its whole grace period."""
        for task in list(self._streams):
            task.cancel()

    def close(self) -> None:
        """Stop the gauges and the lease reaper, then the worker thread."""
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            self._metrics_task = None
        self.leases.stop()
        self._work.shutdown()
