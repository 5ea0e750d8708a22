"""TargetServicer: the `specdec.v1.TargetWorker` gRPC service around an in-process TargetVerifier.

It only translates: deltas -> full histories (HistoryStore), draft q (prob_codec) ->
weights, one batched `verify` per call, outcomes -> the reply. In the tensor-parallel group
the leader's verifier runs on a runner that mirrors every cache operation to the other
ranks; this servicer does not know the difference. Every sequence is held under its
router's lease (LeaseReaper): a router that stops renewing it loses its slots. Its calls,
compute and cache use go to its WorkerMetrics (none recorded unless the actor passes real ones).
"""

from __future__ import annotations

import logging
import time

import grpc

from specdec.target_verifier import TargetVerifier
from specdec.verifier import VerifyRequest, VerifyResult
from specdec_rpc.history_sync import AppliedDeltas, HistoryStore, sampling_from_proto
from specdec_rpc.lease_reaper import DEFAULT_LEASE_TTL_S, LeaseReaper
from specdec_rpc.logprob_messages import to_logprobs
from specdec_rpc.prob_codec import decode_rows
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from specdec_rpc.worker_runtime import CallStats, SerialExecutor, run_locked, run_serially

logger = logging.getLogger(__name__)


class TargetServicer(worker_pb2_grpc.TargetWorkerServicer):
    """Serves one TargetVerifier; calls run one at a time on a worker thread."""

    def __init__(
        self,
        verifier: TargetVerifier,
        model: str,
        num_slots: int,
        tensor_parallel_size: int = 1,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.verifier = verifier
        self.model = model
        self.num_slots = num_slots
        self.tensor_parallel_size = tensor_parallel_size
        self.histories = HistoryStore()
        self.stats = CallStats()
        self._work = SerialExecutor("target-worker")
        self.leases = LeaseReaper(lease_ttl_s, self._work, self._release)
        self.metrics = metrics or WorkerMetrics.off("target", rank=0)
        self._metrics_task = None

    def start(self) -> None:
        """On the server's event loop: start freeing the slots of lapsed leases and updating the
        cache and lease gauges."""
        self.leases.start()
        if self._metrics_task is None:
            self._metrics_task = self.metrics.poll(self.state)

    def state(self) -> WorkerState:
        """The cache and leases now (read on the event loop, which owns the lease table)."""
        return WorkerState(self.num_slots, self.verifier.num_free_slots, len(self.leases.table), len(self.histories),
                           self.leases.table.expired_sequences)

    async def Verify(self, request: worker_pb2.VerifyRequest, context: grpc.aio.ServicerContext):
        with self.leases.call(request.lease_id):
            return await run_locked(self._work, context, "Verify", self._verify, request, calls=self.metrics)

    async def _verify(self, request: worker_pb2.VerifyRequest) -> worker_pb2.VerifyResponse:
        start = time.perf_counter()
        deltas = [item.history for item in request.items]
        applied = self.histories.apply_all(deltas)
        self.leases.hold(request.lease_id, applied.applied_seq_ids(deltas))
        outcomes, batch_size, verified_tokens = await self._work.run(self._run, request, applied)
        if batch_size:
            self.stats.record(batch_size)
        seconds = time.perf_counter() - start
        self.metrics.observe_compute("Verify", seconds, verified_tokens)
        return worker_pb2.VerifyResponse(outcomes=outcomes, resync_seq_ids=applied.resync_seq_ids,
                                         compute_seconds=seconds)

    def _run(self, request: worker_pb2.VerifyRequest, applied: AppliedDeltas):
        """On the worker thread: decode q, drop stale state of diverged sequences, verify.
        Returns (outcomes, sequences verified, drafted tokens verified)."""
        requests = [
            self._to_request(item, history)
            for item, history in zip(request.items, applied.histories)
            if history is not None
        ]
        for seq_id in applied.diverged_seq_ids:
            self.verifier.release(seq_id)
        results = self.verifier.verify(requests)
        verified = sum(len(r.draft_token_ids) for r in requests)
        return self._outcomes(request, applied.histories, results), len(requests), verified

    def _to_request(self, item: worker_pb2.VerifyItem, history: list[int]) -> VerifyRequest:
        """The core request; q that does not decode (wrong count, size or ids) is not
        trusted: the row is verified without drafts (the verifier checks the rest)."""
        drafted = list(item.draft_token_ids)
        sampling = sampling_from_proto(item.history.sampling)
        probs = None
        try:
            if item.draft_probs and len(item.draft_probs) != len(drafted):
                raise ValueError(f"{len(item.draft_probs)} draft_probs for {len(drafted)} drafted tokens")
            probs = decode_rows(item.draft_probs, self.verifier.vocab_size) if item.draft_probs else None  # [n, V]
        except ValueError as exc:
            logger.warning("sequence %s: drafts not verified (%s)", item.history.seq_id, exc)
            self.verifier.rejected_proposals += 1
            drafted = []
        logprobs = item.logprobs if item.HasField("logprobs") else None
        return VerifyRequest(item.history.seq_id, history, drafted, sampling, probs, logprobs)

    @staticmethod
    def _outcomes(request, histories, results: list[VerifyResult]) -> list[worker_pb2.VerifyOutcome]:
        """One outcome per item, in order (empty for resync items)."""
        outcomes, done = [], iter(results)
        for item, history in zip(request.items, histories):
            if history is None:
                outcomes.append(worker_pb2.VerifyOutcome(seq_id=item.history.seq_id))
                continue
            result = next(done)
            outcomes.append(
                worker_pb2.VerifyOutcome(
                    seq_id=result.seq_id, emitted_token_ids=result.emitted, num_accepted=result.num_accepted,
                    logprobs=to_logprobs(result.logprobs),
                )
            )
        return outcomes

    async def Release(self, request: worker_pb2.ReleaseRequest, context: grpc.aio.ServicerContext):
        with self.leases.call(request.lease_id):
            await run_serially(self._work, context, "Release", self._release, list(request.seq_ids), calls=self.metrics)
        self.leases.released(request.seq_ids)
        return worker_pb2.ReleaseResponse()

    def _release(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self.verifier.release(seq_id)
            self.histories.release(seq_id)

    async def GetInfo(self, request: worker_pb2.InfoRequest, context: grpc.aio.ServicerContext):
        self.metrics.observe_call("GetInfo")
        return self.info()

    async def KeepAlive(self, request: worker_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext):
        held = self.leases.keep_alive(request.lease_id)
        self.metrics.observe_call("KeepAlive")
        return worker_pb2.KeepAliveResponse(lease_ttl_s=self.leases.ttl_s, held_sequences=held)

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(
            model=self.model,
            vocab_size=self.verifier.vocab_size,
            max_seq_len=self.verifier.max_seq_len,
            num_slots=self.num_slots,
            free_slots=self.verifier.num_free_slots,
            tensor_parallel_size=self.tensor_parallel_size,
            runner=self.verifier.runner_kind,
            calls=self.stats.calls,
            sequences=self.stats.sequences,
            max_batch_size=self.stats.max_batch_size,
            rejected_proposals=self.verifier.rejected_proposals,
            **self.leases.info_fields(),
        )

    def close(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            self._metrics_task = None
        self.leases.stop()
        self._work.shutdown()
