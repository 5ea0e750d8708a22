"""RemoteProposer: the Proposer interface over gRPC to a DraftWorker.

Speculation is only an optimisation, so the draft worker can never fail a round: when a
call fails (unavailable, deadline, bad reply) the round goes on with no drafted tokens, the
failure is logged and counted, and the next call sends whole histories again. Sequences
the worker asks to resync (it restarted) are sent again at once with their whole history.
Releases are buffered and sent before the next call (or by `flush()`). Every call carries
the router's lease id; a LeaseRenewer keeps the lease alive between calls (see worker.proto).

Not thread-safe: one engine drives it.
"""

from __future__ import annotations

import logging

import grpc
import torch

from specdec.proposers.base import Proposal, ProposalRequest, Proposer
from specdec_rpc.history_sync import HistorySender
from specdec_rpc.lease_reaper import DEFAULT_LEASE_TTL_S
from specdec_rpc.lease_renewer import LeaseRenewer, new_lease_id
from specdec_rpc.prob_codec import decode_rows
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker_server import CHANNEL_OPTIONS

logger = logging.getLogger(__name__)


class RemoteProposer(Proposer):
    """Drafts with a remote draft model; q arrives float16-exact, as the draft sampled it."""

    has_probs = True
    names = ("draft",)

    def __init__(
        self, address: str, timeout_s: float = 30.0, lease_id: str | None = None, lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    ) -> None:
        """address: the DraftWorker's host:port; timeout_s: deadline of each call (keep it short);
        lease_id: the router's lease (None = a new one); lease_ttl_s: assumed until the worker says."""
        self.address = address
        self.timeout_s = timeout_s
        self.failures = 0  # calls that failed, so their round ran without draft proposals
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = worker_pb2_grpc.DraftWorkerStub(self._channel)
        self.lease = LeaseRenewer(lease_id or new_lease_id(), self._keep_alive, lease_ttl_s).start()
        self._sender = HistorySender(namespace=f"{self.lease.lease_id}/")  # see RemoteVerifier
        self._released: list[str] = []  # wire ids whose Release is not sent yet
        self._vocab_size: int | None = None
        self.last_compute_s = 0.0

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        gamma = max((r.gamma for r in requests), default=0)
        if gamma == 0:
            return Proposal.empty(len(requests), gamma)
        self.last_compute_s = 0.0  # the worker's compute in this call (RoundProfile)
        try:
            self.flush()
            vocab_size = self._vocab()
            proposal = self._proposal(requests, gamma, self._drafts(requests), vocab_size)
            self.unavailable_reason = None
            return proposal
        except (grpc.RpcError, ValueError) as exc:
            self._sender.reset(r.seq_id for r in requests)
            self.failures += 1
            self.unavailable_reason = f"draft worker {self.address} failed: {_describe(exc)}"
            logger.warning(
                "draft worker %s: Propose failed, no draft tokens this round: %s", self.address, _describe(exc)
            )
            return Proposal.empty(len(requests), gamma)

    def _vocab(self) -> int:
        """Width of the q rows (the target's vocabulary), asked once."""
        if self._vocab_size is None:
            self._vocab_size = self.info().vocab_size
        return self._vocab_size

    def _request(self, requests: list[ProposalRequest]) -> worker_pb2.ProposeRequest:
        deltas = [self._sender.delta(r.seq_id, r.token_ids, r.sampling) for r in requests]
        return worker_pb2.ProposeRequest(
            sequences=deltas, gammas=[r.gamma for r in requests], lease_id=self.lease.lease_id
        )

    def _call(self, requests: list[ProposalRequest]) -> worker_pb2.ProposeResponse:
        self.lease.touch()
        response = self._stub.Propose(self._request(requests), timeout=self.timeout_s)
        self.last_compute_s += response.compute_seconds
        if len(response.drafts) != len(requests):
            raise ValueError(f"{len(response.drafts)} drafts for {len(requests)} sequences")
        return response

    def _drafts(self, requests: list[ProposalRequest]) -> list[worker_pb2.DraftedTokens]:
        """One DraftedTokens per request. Sequences the worker asks to resync (it restarted)
        are sent again at once with their whole history, so a draft restart costs a prefill,
        not a round without drafts (which would change a seeded request's schedule)."""
        first = self._call(requests)
        drafts = list(first.drafts)
        resync = {self._sender.local_id(w) for w in first.resync_seq_ids}
        if not resync:
            return drafts
        self._sender.reset(resync)
        rows = [i for i, r in enumerate(requests) if r.seq_id in resync]
        again = self._call([requests[i] for i in rows])
        if again.resync_seq_ids:
            raise ValueError(f"draft worker asked to resync whole histories: {list(again.resync_seq_ids)}")
        for i, draft in zip(rows, again.drafts):
            drafts[i] = draft
        return drafts

    def _proposal(
        self, requests: list[ProposalRequest], gamma: int, drafts: list[worker_pb2.DraftedTokens], vocab_size: int
    ) -> Proposal:
        """The reply as a Proposal; raises ValueError when it breaks the protocol."""
        proposal = Proposal.empty(len(requests), gamma)
        rows_with_probs = {}
        for i, (request, draft) in enumerate(zip(requests, drafts)):
            n = len(draft.token_ids)
            matches = draft.seq_id == self._sender.wire_id(request.seq_id) and n <= request.gamma
            if not matches or (draft.probs and len(draft.probs) != n):
                raise ValueError(f"draft for {request.seq_id!r} does not match its request (gamma {request.gamma})")
            proposal.token_ids[i, :n] = torch.tensor(list(draft.token_ids), dtype=torch.long)
            proposal.num_drafted[i] = n
            if draft.probs:
                rows_with_probs[i] = decode_rows(draft.probs, vocab_size)  # [n, V]
        if rows_with_probs:  # greedy rows, sent without q, get a one-hot q
            proposal.set_probs(rows_with_probs, vocab_size)
        return proposal

    def release(self, seq_id: str) -> None:
        """Buffered: sent with the next call or flush()."""
        self._sender.reset([seq_id])
        self._released.append(self._sender.wire_id(seq_id))

    def flush(self) -> bool:
        """Send buffered releases now; False (ids kept for the next try) when the call failed."""
        if not self._released:
            return True
        try:
            self.lease.touch()
            release = worker_pb2.ReleaseRequest(seq_ids=self._released, lease_id=self.lease.lease_id)
            self._stub.Release(release, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            logger.warning("draft worker %s: Release failed (will retry): %s", self.address, _describe(exc))
            return False
        self._released = []
        return True

    def info(self) -> worker_pb2.WorkerInfo:
        """The worker's WorkerInfo (after sending buffered releases); raises grpc.RpcError when unreachable."""
        self.flush()
        return self._stub.GetInfo(worker_pb2.InfoRequest(), timeout=self.timeout_s)

    def _keep_alive(self, lease_id: str) -> float:
        """One KeepAlive (from the LeaseRenewer's thread); returns the worker's lease TTL."""
        request = worker_pb2.KeepAliveRequest(lease_id=lease_id)
        return self._stub.KeepAlive(request, timeout=min(self.timeout_s, self.lease.period_s)).lease_ttl_s

    def close(self) -> None:
        """Send buffered releases (best effort), stop renewing the lease, close the channel."""
        self.flush()
        self.lease.close()
        self._channel.close()


def _describe(exc: Exception) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
