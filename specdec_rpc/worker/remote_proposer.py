"""RemoteProposer: the Proposer interface over gRPC to a DraftWorker.

Speculation is only an optimisation, so the draft worker can never fail a round: when a
call fails (unavailable, deadline, bad reply) the round goes on with no drafted tokens, the
failure is logged and counted, and the next call sends whole histories again. Sequences
the worker asks to resync (it restarted) are sent again at once with their whole history.
The channel, lease, release buffer and reconnector are the WorkerClient base's
(worker_client.py); releases ride on the next call.

A worker that is down (UNAVAILABLE, DEADLINE_EXCEEDED) is not called again every round:
rounds go on without drafts (`unavailable_reason` says why) while a WorkerReconnector asks
`resolve()` for the worker's address (its supervisor restarts it, perhaps elsewhere) and
probes it; once one answers, the client switches to it and every sequence sends its whole
history (the new worker holds none), so speculation resumes by itself.

Every call on the round's path has a deadline far below `timeout_s` (`DraftDeadline`: a
small multiple of the p99 of recent calls, with a floor and a cap): a round whose drafts
miss it goes on without them (target-only rows, lossless) and resets those rows' sent
histories, so the next call sends them whole (the late reply may or may not have reached
the worker: its state for them is resynced, never trusted). The late call is left to end
on its own (within `timeout_s`) and its reply is discarded; while it runs, rounds skip the
worker without waiting (a stopped worker costs one budget, not one per round). A worker
that keeps missing, or whose late call fails as a down worker's does, is down: the circuit
is open until a background probe answers within the budget's cap. Buffered releases ride
on the round's call (`release_seq_ids`, freed before its sequences; buffered again when the
call fails or is late); `flush()` sends them in a Release call of their own.

Not thread-safe: one engine drives it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from specdec.round.draft_deadline import DraftDeadline
from specdec.proposers.base import Branch, Drafts, Proposal, ProposalRequest, Proposer
from specdec_rpc.worker.lease_reaper import DEFAULT_LEASE_TTL_S
from specdec_rpc.worker.prob_codec import WireQ
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_client import StreamMethod, WorkerClient

logger = logging.getLogger(__name__)

#: call failures that mean the worker is down: stop calling it until it answers again
WORKER_DOWN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class DraftLate(Exception):
    """A draft call missed its round's deadline (the call itself goes on: `LateCall`)."""


@dataclass
class LateCall:
    """A call that missed its deadline and has not ended yet; `ended` is set when it ends."""

    future: grpc.Future  # a StreamCall (round_stream.py): the part of a grpc.Future used here
    started: float
    ended: float | None = None

    def __post_init__(self) -> None:
        self.future.add_done_callback(self._done)

    def _done(self, _future) -> None:
        self.ended = time.monotonic()


class RemoteProposer(WorkerClient, Proposer):
    """Drafts with a remote draft model; q arrives as the draft encoded it (float16-exact,
    as it sampled from it) and goes on to the target as it came (prob_codec.WireQ)."""

    has_probs = True
    names = ("draft",)
    stub_class = worker_pb2_grpc.DraftWorkerStub
    round_stream = StreamMethod.of("DraftWorker", "ProposeStream")

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        lease_id: str | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        resolve: Callable[[], str | None] | None = None,
        secret: str | None = None,
    ) -> None:
        """address: the DraftWorker's host:port; timeout_s: the longest any call may run (a
        round waits for its drafts only `deadline.budget_s()`, capped far below it);
        lease_id: the router's lease (None = a new one); lease_ttl_s: assumed until the worker says;
        resolve: the worker's current address after it went down (None = the same address)."""
        super().__init__(address, timeout_s, lease_id, resolve, secret)
        self.failures = 0  # rounds that ran without draft proposals because a call failed or the worker is down
        self.reconnects = 0  # times the client found its worker again after it went down
        self._down: tuple[float, str] | None = None  # (since, why) while the worker is down
        self._fresh_worker = False  # switched to a worker that holds no history yet
        self._renew_lease(lease_ttl_s)
        self.deadline = DraftDeadline.within(timeout_s)
        self._due = 0.0  # when the current round stops waiting for its drafts (time.monotonic)
        self._late: LateCall | None = None  # the call that missed its deadline, while it runs
        self._riding: list[str] = []  # the buffered releases the round's call carries (release_seq_ids)

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        if not any(r.gamma > 0 for r in requests):
            return [Drafts() for _ in requests]
        return self._guarded(requests, [Drafts() for _ in requests],
                             lambda: self._proposal(requests, self._drafts(requests)))

    def look_ahead(self, requests: list[ProposalRequest], unverified: list[int],
                   branches: int = 1) -> list[list[Branch]]:
        """The worker's look-ahead branches (one Propose call with `unverified`)."""
        if not any(r.gamma > 0 for r in requests):
            return [[] for _ in requests]

        def call() -> list[list[Branch]]:
            drafts = self._drafts(requests, unverified, branches)
            return [self._branches(request, draft) for request, draft in zip(requests, drafts)]

        return self._guarded(requests, [[] for _ in requests], call)

    def _guarded(self, requests: list[ProposalRequest], empty, call: Callable[[], object]):
        """call() within the round's draft deadline, or `empty` (no drafts, lossless)
        when the worker is down, still busy with a late call, or the call fails or misses the
        deadline: the failure is counted and logged, and a worker that went down is looked
        for again in the background."""
        self.last_compute_s = 0.0  # the worker's compute in this call (RoundProfile)
        if self._still_late() or self._is_down():
            self.failures += 1
            self.unavailable_reason = self._late_reason() if self._late is not None else self._down_reason()
            return empty
        self._due = time.monotonic() + self.deadline.budget_s()
        self._riding = self._take_releases()
        try:
            result = call()
            self.unavailable_reason = None
            return result
        except DraftLate as exc:
            self._keep_releases(self._riding)  # sent again (the worker ignores ids it already freed)
            self._missed(requests, exc)
            return empty
        except (grpc.RpcError, ValueError) as exc:
            self._keep_releases(self._riding)
            self._sender.reset(r.seq_id for r in requests)
            self.failures += 1
            self.unavailable_reason = f"draft worker {self.address} failed: {_describe(exc)}"
            logger.warning(
                "draft worker %s: Propose failed, no draft tokens this round: %s", self.address, _describe(exc)
            )
            if isinstance(exc, grpc.RpcError) and exc.code() in WORKER_DOWN:
                self._went_down(_describe(exc))
            return empty
        except BaseException:
            self._keep_releases(self._riding)  # whatever else failed, the releases are not lost
            raise

    def _missed(self, requests: list[ProposalRequest], exc: DraftLate) -> None:
        """The round's call missed its deadline: its rows send whole histories next time (the
        worker may apply the late call's deltas or not); one that keeps missing is down."""
        self._sender.reset(r.seq_id for r in requests)
        self.failures += 1
        self.unavailable_reason = self._late_reason()
        logger.warning("draft worker %s: %s; no draft tokens this round", self.address, exc)
        if self.deadline.missed():
            self._went_down(f"missed its deadline {self.deadline.misses} times in a row")
            self.unavailable_reason = self._down_reason()

    def _still_late(self) -> bool:
        """True while a call that missed its deadline runs; when it has ended, learns from it:
        its time (a slower draft raises its own budget), or that the worker is down."""
        late = self._late
        if late is None:
            return False
        if not late.future.done():
            return True
        self._late = None
        if late.future.cancelled():
            return False
        exc = late.future.exception()
        if exc is None:
            self.deadline.answered_late((late.ended or time.monotonic()) - late.started)
        elif isinstance(exc, grpc.RpcError) and exc.code() in WORKER_DOWN:
            self._went_down(f"a late call ended with {_describe(exc)}")
        return False

    def _late_reason(self) -> str:
        late = self._late
        running = "" if late is None else f"; a call has run {time.monotonic() - late.started:.1f}s"
        return f"draft worker {self.address} missed its deadline of {self.deadline.describe()}{running}"

    def _is_down(self) -> bool:
        """True while the worker is down; after a switch to a fresh worker, forgets what was sent."""
        with self._lock:
            if self._down is None and self._fresh_worker:
                self._sender.clear()  # the new worker holds no history: send whole histories
                self._fresh_worker = False
            return self._down is not None

    def _went_down(self, why: str) -> None:
        with self._lock:
            if self._down is None:
                self._down = (time.monotonic(), why)
        self.reconnector.trigger()

    def _down_reason(self) -> str:
        down = self._down
        if down is None:
            return f"draft worker {self.address} failed"
        since, why = down
        last = self.reconnector.last_error
        retry = f"; reconnecting (last try: {last})" if last else "; reconnecting"
        return f"draft worker {self.address} is down for {time.monotonic() - since:.0f}s ({why}){retry}"

    @property
    def probe_timeout_s(self) -> float:
        """In time: within the longest a round would wait for drafts."""
        return self.deadline.cap_s

    def _switched_to(self, address: str) -> None:
        """A worker answers at `address` again: use it from the next round (every history whole)."""
        since = self._down[0] if self._down else time.monotonic()
        self._down, self._fresh_worker = None, True
        self._late = None  # on the old channel, which closes
        self.deadline.found_again()
        self.unavailable_reason = None
        self.reconnects += 1
        logger.warning("draft worker back at %s after %.1fs: speculation resumes", address, time.monotonic() - since)

    def _request(self, requests: list[ProposalRequest], unverified: list[int] | None,
                 branches: int) -> worker_pb2.ProposeRequest:
        deltas = [self._sender.delta(r.seq_id, r.token_ids, r.sampling, r.num_prompt_tokens, r.reserve_tokens,
                                     r.grammar and r.grammar.spec) for r in requests]
        return worker_pb2.ProposeRequest(
            sequences=deltas, gammas=[r.gamma for r in requests], lease_id=self.lease.lease_id,
            unverified=unverified or [], branches=branches, release_seq_ids=self._riding,
        )

    def _call(self, requests: list[ProposalRequest], unverified: list[int] | None = None,
              branches: int = 1) -> worker_pb2.ProposeResponse:
        self.lease.touch()
        started = time.monotonic()
        future = self._rounds.send(self._request(requests, unverified, branches))
        try:
            response = future.result(timeout=max(0.0, self._due - started))
        except grpc.FutureTimeoutError:
            self._late = LateCall(future, started)
            raise DraftLate(f"Propose missed its deadline of {self.deadline.describe()}") from None
        self.deadline.answered(time.monotonic() - started)
        self._riding = []  # applied by the worker: a resync call does not carry them again
        self.last_compute_s += response.compute_seconds
        if len(response.drafts) != len(requests):
            raise ValueError(f"{len(response.drafts)} drafts for {len(requests)} sequences")
        return response

    def _drafts(self, requests: list[ProposalRequest], unverified: list[int] | None = None,
                branches: int = 1) -> list[worker_pb2.DraftedTokens]:
        """One DraftedTokens per request (with `unverified`: look-ahead branches). Sequences
        the worker asks to resync (it restarted) are sent again at once with their whole
        history, so a draft restart costs a prefill, not a round without drafts."""
        first = self._call(requests, unverified, branches)
        drafts = list(first.drafts)
        resync = {self._sender.local_id(w) for w in first.resync_seq_ids}
        if not resync:
            return drafts
        self._sender.reset(resync)
        rows = [i for i, r in enumerate(requests) if r.seq_id in resync]
        again = self._call([requests[i] for i in rows], unverified and [unverified[i] for i in rows], branches)
        if again.resync_seq_ids:
            raise ValueError(f"draft worker asked to resync whole histories: {list(again.resync_seq_ids)}")
        for i, draft in zip(rows, again.drafts):
            drafts[i] = draft
        return drafts

    def _proposal(self, requests: list[ProposalRequest], drafts: list[worker_pb2.DraftedTokens]) -> Proposal:
        """The reply as one Drafts per request, q still as the worker encoded it (the target
        decodes and checks it); raises ValueError when the reply names other sequences or
        drafts more than asked."""
        proposal = []
        for request, draft in zip(requests, drafts):
            if draft.seq_id != self._sender.wire_id(request.seq_id) or len(draft.token_ids) > request.gamma:
                raise ValueError(f"draft for {request.seq_id!r} does not match its request (gamma {request.gamma})")
            proposal.append(Drafts(list(draft.token_ids), WireQ(draft.probs) if draft.probs else None))
        return proposal

    def _branches(self, request: ProposalRequest, draft: worker_pb2.DraftedTokens) -> list[Branch]:
        """A reply's look-ahead branches (q as sent); raises ValueError when they break the protocol."""
        if draft.seq_id != self._sender.wire_id(request.seq_id):
            raise ValueError(f"look-ahead for {request.seq_id!r} names another sequence ({draft.seq_id!r})")
        branches = []
        for wire in draft.branches:
            if len(wire.token_ids) > request.gamma or wire.base_length > len(request.token_ids):
                raise ValueError(f"look-ahead branch of {request.seq_id!r} does not match its request")
            q = WireQ(wire.probs) if wire.probs else None
            branches.append(Branch(wire.base_length, wire.token_id, list(wire.token_ids), q))
        return branches

    def flush(self) -> bool:
        """Send buffered releases now and wait for the reply; False (ids kept for the next
        try) when the call failed."""
        future = self._send_releases()
        if future is None:
            return not self._released
        try:
            future.result()
        except grpc.RpcError:
            return False
        return True

    def _send_releases(self) -> grpc.Future | None:
        """Send buffered releases without waiting (a round never waits for them); ids whose
        call fails are buffered again. None when there was nothing to send, or the worker is down."""
        seq_ids = self._take_releases()
        if not seq_ids:
            return None
        future = self._stub.Release.future(self._release_request(seq_ids), timeout=self.timeout_s)
        future.add_done_callback(lambda done: self._release_done(done, seq_ids))
        return future

    def _release_done(self, future: grpc.Future, seq_ids: list[str]) -> None:
        """(gRPC's thread) A Release ended; on failure its ids are sent again with the next call."""
        if future.cancelled() or future.exception() is not None:
            why = "cancelled" if future.cancelled() else _describe(future.exception())
            logger.warning("draft worker %s: Release failed (will retry): %s", self.address, why)
            self._keep_releases(seq_ids)

    def _holds_releases(self) -> bool:
        return self._down is not None  # kept for the worker that answers next


def _describe(exc: Exception) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
