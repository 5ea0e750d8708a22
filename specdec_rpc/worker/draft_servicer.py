"""DraftServicer: the `specdec.v1.DraftWorker` gRPC service around an in-process DraftModelProposer.

It only translates: deltas -> full histories (HistoryStore), one batched `propose` per
call, drafted tokens and q (prob_codec, encoded once: routers pass it on to the target as
it is) -> the reply. The proposer rounds q to float16 before sampling (wire_dtype), so the
q it sends is exactly the q it sampled from. Greedy rows send no q (their verification
needs none; the proposer gives them none). Leases, Release, GetInfo, KeepAlive and the
metrics are the WorkerServicer base's (worker_servicer.py).

Structured output: a sequence whose delta carries a grammar (HistoryDelta.grammar) gets a
matcher of its own here (`GrammarFollowers`: compiled by the worker's grammar backend on the
target's tokenizer), which follows its history and hands the proposer the `GrammarCursor` an
in-process draft gets, so it drafts under the mask the target verifies under, and q is the
masked distribution it drew from. A grammar that does not compile costs its sequence its
drafts (γ 0), never the call; a released sequence frees its matcher.
"""

from __future__ import annotations

import time

import grpc
import torch

from specdec.config.config import SpecdecConfig
from specdec.wiring.engine_builder import eos_token_ids, load_draft_proposer, load_tokenizer
from specdec.models.runners import vocab_size_of
from specdec.models.model_paths import resolve_model_path
from specdec.proposers.base import Proposal, ProposalRequest
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.sampling.grammar_follower import GrammarFollowers
from specdec.sampling.grammar_matcher import GrammarBackend
from specdec.sampling.grammar_xgrammar import XGrammarBackend
from specdec_rpc.worker.history_sync import AppliedDeltas
from specdec_rpc.worker.lease_reaper import DEFAULT_LEASE_TTL_S
from specdec_rpc.worker.prob_codec import encode_rows
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from specdec_rpc.worker.worker_runtime import check_caller_waits, run_locked
from specdec_rpc.worker.worker_servicer import WorkerServicer

MAX_BRANCHES = 16  # ProposeRequest.branches above this is refused (INVALID_ARGUMENT)

WIRE_DTYPE = torch.float16  # q travels as binary16 (see prob_codec)


def target_vocab_size(target: str) -> int:
    """Vocabulary rows of the target's output layer, read from its config (no weights loaded)."""
    return vocab_size_of(resolve_model_path(target))


def load_wire_draft_proposer(config: SpecdecConfig, tokenizer=None) -> DraftModelProposer:
    """The configured draft model, checked against the target's tokenizer (loaded when not
    given), drafting float16 q."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.models.target)
    vocab_size = target_vocab_size(config.models.target)
    return load_draft_proposer(config.models, config.cache, vocab_size, tokenizer, wire_dtype=WIRE_DTYPE)


class DraftServicer(WorkerServicer, worker_pb2_grpc.DraftWorkerServicer):
    """Serves one DraftModelProposer; calls run one at a time (WorkerServicer._step)."""

    def __init__(
        self,
        proposer: DraftModelProposer,
        model: str,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        metrics: WorkerMetrics | None = None,
        grammars: GrammarBackend | None = None,
    ) -> None:
        """grammars: compiles the grammars sequences carry, on the target's tokenizer (None:
        every grammar fails its sequence, which then drafts nothing)."""
        if proposer.wire_dtype != WIRE_DTYPE:
            raise ValueError(
                f"the draft proposer must round q to {WIRE_DTYPE} before sampling (wire_dtype), "
                f"got wire_dtype={proposer.wire_dtype}"
            )
        self.proposer = proposer
        self.model = model
        self.grammars = GrammarFollowers(grammars, proposer.vocab_size)  # per sequence, in the model step
        super().__init__("draft-worker", lease_ttl_s, metrics or WorkerMetrics.off("draft"))

    @classmethod
    def from_config(cls, config: SpecdecConfig, metrics: WorkerMetrics | None = None) -> "DraftServicer":
        tokenizer = load_tokenizer(config.models.target)
        grammars = XGrammarBackend(tokenizer, eos_token_ids(config.models.target, tokenizer))
        return cls(load_wire_draft_proposer(config, tokenizer), config.models.draft, config.serving.lease_ttl_s,
                   metrics, grammars)

    def state(self) -> WorkerState:
        runner = self.proposer.runner
        return WorkerState(runner.cache.num_slots, self.proposer.num_free_slots, len(self.leases.table),
                           len(self.histories), self.leases.table.expired_sequences)

    async def Propose(self, request: worker_pb2.ProposeRequest, context: grpc.aio.ServicerContext):
        with self.leases.call(request.lease_id):
            return await run_locked(self._work, context, "Propose", self._propose, request, context,
                                    calls=self.metrics)

    async def ProposeStream(self, requests, context: grpc.aio.ServicerContext):
        async for response in self._serve_stream(requests, context, self.Propose):
            yield response

    async def _propose(self, request: worker_pb2.ProposeRequest,
                       context: grpc.aio.ServicerContext) -> worker_pb2.ProposeResponse:
        """Under the worker's lock. A call whose router stopped waiting for it (its deadline
        passed while it waited) applies none of its deltas: the router resyncs those rows."""
        check_caller_waits(context, "Propose")
        start = time.perf_counter()
        if len(request.gammas) != len(request.sequences):
            raise ValueError(f"{len(request.gammas)} gammas for {len(request.sequences)} sequences")
        if request.unverified and len(request.unverified) != len(request.sequences):
            raise ValueError(f"{len(request.unverified)} unverified counts for {len(request.sequences)} sequences")
        if request.branches > MAX_BRANCHES:
            raise ValueError(f"branches={request.branches} is more than {MAX_BRANCHES}")
        self._forget_released(request.release_seq_ids)
        applied = self.histories.apply_all(request.sequences)
        held = applied.applied_seq_ids(request.sequences)
        self.leases.hold(request.lease_id, held)
        samplings = [self.sampling(d.sampling) for d, h in zip(request.sequences, applied.histories) if h is not None]
        drafts = await self._step(sum(len(r.token_ids) for r in request.sequences), self._run, request, applied,
                                  samplings)
        self.stats.record(len(held))
        seconds = time.perf_counter() - start
        drafted = sum(len(draft.token_ids) + sum(len(b.token_ids) for b in draft.branches) for draft in drafts)
        self.metrics.observe_compute("Propose", seconds, drafted)
        return worker_pb2.ProposeResponse(drafts=drafts, resync_seq_ids=applied.resync_seq_ids, compute_seconds=seconds)

    def _run(self, request: worker_pb2.ProposeRequest, applied: AppliedDeltas, samplings: list):
        """The model step (`_step`: on the event loop or the worker thread): free the released
        sequences, draft (the proposer follows any history, diverged ones too), encode."""
        self._free_released(request.release_seq_ids)
        rows = self._rows(request, applied, samplings)
        if request.unverified:
            return self._look_ahead(request, applied.histories, rows)
        proposal = self.proposer.propose(rows) if rows else None
        return self._drafts(request, applied.histories, proposal)

    def _rows(self, request: worker_pb2.ProposeRequest, applied: AppliedDeltas, samplings: list) -> list:
        """A ProposalRequest per applied delta (resync entries have none), in order, each under
        its sequence's grammar: a cursor at the end of the history the target emitted (a
        look-ahead's unverified drafts are the cursor's to walk), or γ 0 where the grammar failed."""
        rows, sampling = [], iter(samplings)
        for k, (delta, history) in enumerate(zip(request.sequences, applied.histories)):
            if history is None:
                continue
            if delta.HasField("grammar"):
                self.grammars.start(delta.seq_id, delta.grammar, delta.num_prompt_tokens)
            confirmed = len(history) - (request.unverified[k] if request.unverified else 0)
            cursor = self.grammars.cursor(delta.seq_id, history, delta.offset, confirmed)
            rows.append(ProposalRequest(delta.seq_id, history, next(sampling),
                                        gamma=0 if self.grammars.failed(delta.seq_id) else request.gammas[k],
                                        num_prompt_tokens=delta.num_prompt_tokens,
                                        reserve_tokens=delta.reserve_tokens or None, grammar=cursor))
        return rows

    def _look_ahead(self, request, histories, rows: list[ProposalRequest]) -> list[worker_pb2.DraftedTokens]:
        """One DraftedTokens per request entry with the look-ahead's branches (none for resync entries)."""
        unverified = [u for u, history in zip(request.unverified, histories) if history is not None]
        found = self.proposer.look_ahead(rows, unverified, request.branches) if rows else []
        drafts, row = [], 0
        for delta, history in zip(request.sequences, histories):
            draft = worker_pb2.DraftedTokens(seq_id=delta.seq_id)
            if history is not None:
                for branch in found[row]:
                    wire = draft.branches.add(base_length=branch.base_length, token_id=branch.token_id,
                                              token_ids=branch.token_ids)
                    if branch.probs is not None and branch.token_ids:
                        wire.probs.extend(encode_rows(branch.probs))  # [n, vocab]
                row += 1
            drafts.append(draft)
        return drafts

    @staticmethod
    def _drafts(request, histories, proposal: Proposal | None):
        """One DraftedTokens per request entry, in order (empty for resync entries); q is
        encoded here, once (greedy rows carry none)."""
        drafts, found = [], iter(proposal or [])
        for delta, history in zip(request.sequences, histories):
            draft = worker_pb2.DraftedTokens(seq_id=delta.seq_id)
            if history is not None:
                row = next(found)
                draft.token_ids.extend(row.token_ids)
                if row.q is not None and row.token_ids:
                    draft.probs.extend(encode_rows(row.q))  # [n, vocab]
            drafts.append(draft)
        return drafts

    def _free(self, seq_id: str) -> None:
        self.proposer.release(seq_id)
        self.grammars.release(seq_id)

    def info(self) -> worker_pb2.WorkerInfo:
        """vocab_size is the width of the q rows it sends: the target's vocabulary."""
        runner = self.proposer.runner
        num_blocks, block_size = runner.block_capacity
        return self._info(
            num_blocks=num_blocks,
            block_size=block_size,
            model=self.model,
            vocab_size=self.proposer.vocab_size,
            max_seq_len=runner.max_seq_len,
            num_slots=runner.cache.num_slots,
            free_slots=self.proposer.num_free_slots,
            tensor_parallel_size=1,
            runner=runner.runner_kind,
        )
