"""TargetServicer: the `specdec.v1.TargetWorker` gRPC service around an in-process TargetVerifier.

It only translates: deltas -> full histories (HistoryStore), draft q passed on as it came
(prob_codec.WireQ: the verifier decodes it), one batched `verify` per call, outcomes -> the
reply. In the tensor-parallel group the leader's verifier runs on a runner that mirrors
every cache operation to the other ranks; this servicer does not know the difference.
Leases, Release, GetInfo, KeepAlive and the metrics are the WorkerServicer base's
(worker_servicer.py).
"""

from __future__ import annotations

import time

import grpc

from specdec.sampling import grammar_mask
from specdec.verifiers.target_verifier import TargetVerifier
from specdec.verifiers.verifier import VerifyRequest, VerifyResult
from specdec_rpc.worker.history_sync import AppliedDeltas
from specdec_rpc.worker.lease_reaper import DEFAULT_LEASE_TTL_S
from specdec_rpc.worker.logprob_messages import to_logprobs
from specdec_rpc.worker.prob_codec import WireQ
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from specdec_rpc.worker.worker_runtime import run_locked
from specdec_rpc.worker.worker_servicer import WorkerServicer


class TargetServicer(WorkerServicer, worker_pb2_grpc.TargetWorkerServicer):
    """Serves one TargetVerifier; calls run one at a time (WorkerServicer._step)."""

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
        # a tensor-parallel leader waits for its followers through Ray: never on the event loop
        self.inline_steps = tensor_parallel_size == 1
        super().__init__("target-worker", lease_ttl_s, metrics or WorkerMetrics.off("target", rank=0))

    def state(self) -> WorkerState:
        return WorkerState(self.num_slots, self.verifier.num_free_slots, len(self.leases.table), len(self.histories),
                           self.leases.table.expired_sequences)

    async def Verify(self, request: worker_pb2.VerifyRequest, context: grpc.aio.ServicerContext):
        with self.leases.call(request.lease_id):
            return await run_locked(self._work, context, "Verify", self._verify, request, calls=self.metrics)

    async def VerifyStream(self, requests, context: grpc.aio.ServicerContext):
        async for response in self._serve_stream(requests, context, self.Verify):
            yield response

    async def _verify(self, request: worker_pb2.VerifyRequest) -> worker_pb2.VerifyResponse:
        start = time.perf_counter()
        deltas = [item.history for item in request.items]
        self._forget_released(request.release_seq_ids)
        applied = self.histories.apply_all(deltas)
        self.leases.hold(request.lease_id, applied.applied_seq_ids(deltas))
        new_tokens = sum(len(item.history.token_ids) + len(item.draft_token_ids) for item in request.items)
        outcomes, batch_size, verified_tokens = await self._step(new_tokens, self._run, request, applied)
        if batch_size:
            self.stats.record(batch_size)
        seconds = time.perf_counter() - start
        self.metrics.observe_compute("Verify", seconds, verified_tokens)
        return worker_pb2.VerifyResponse(outcomes=outcomes, resync_seq_ids=applied.resync_seq_ids,
                                         compute_seconds=seconds)

    def _run(self, request: worker_pb2.VerifyRequest, applied: AppliedDeltas):
        """The model step (`_step`: on the event loop or the worker thread): free the released
        sequences, drop stale state of diverged sequences, verify (decoding q). Returns
        (outcomes, sequences verified, drafted tokens verified)."""
        self._free_released(request.release_seq_ids)
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
        """The core request, q still encoded: the verifier decodes it (and verifies the row
        without drafts when it does not decode)."""
        probs = WireQ(item.draft_probs) if item.draft_probs else None  # [n] TokenDistribution
        logprobs = item.logprobs if item.HasField("logprobs") else None
        mask = grammar_mask.from_bytes(item.token_mask, len(item.draft_token_ids) + 1)  # [n + 1, W] or None
        prompt_logprobs = item.prompt_logprobs if item.HasField("prompt_logprobs") else None
        return VerifyRequest(item.history.seq_id, history, list(item.draft_token_ids),
                             self.sampling(item.history.sampling), probs,
                             item.history.num_prompt_tokens, logprobs, mask, item.history.reserve_tokens or None,
                             prompt_logprobs, item.prompt_logprobs_from)

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
                    logprobs=to_logprobs(result.logprobs), cached_tokens=result.cached_tokens,
                    prompt_logprobs=to_logprobs([t for t in result.prompt_logprobs or () if t is not None]),
                )
            )
        return outcomes

    def _free(self, seq_id: str) -> None:
        self.verifier.release(seq_id)

    def info(self) -> worker_pb2.WorkerInfo:
        num_blocks, block_size = self.verifier.block_capacity
        return self._info(
            num_blocks=num_blocks,
            block_size=block_size,
            model=self.model,
            vocab_size=self.verifier.vocab_size,
            max_seq_len=self.verifier.max_seq_len,
            num_slots=self.num_slots,
            free_slots=self.verifier.num_free_slots,
            tensor_parallel_size=self.tensor_parallel_size,
            runner=self.verifier.runner_kind,
            rejected_proposals=self.verifier.rejected_proposals,
        )
