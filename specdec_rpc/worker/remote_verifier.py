"""RemoteVerifier: the Verifier interface over gRPC to the target group's leader.

Each round sends history deltas, drafted tokens and their q (greedy rows send no q): a
remote draft's q as the draft encoded it (prob_codec.WireQ, never decoded here), an
in-process proposer's q encoded (prob_codec). Sequences the target does not know any more (it restarted) come back in
`resync_seq_ids`; they are sent again at once with their whole history, so a target restart
costs a prefill, never a wrong token. A target that is unreachable or timed out raises
`WorkerError` (no row caused it: the round fails its batch, UNAVAILABLE); other errors
propagate as grpc.RpcError, so the engine can isolate the row that caused them. The
sequences of a failed call send their whole history next time. The channel, lease, release
buffer and reconnector are the WorkerClient base's (worker_client.py); buffered releases ride
on the next Verify call (`release_seq_ids`, freed before its items), so no round waits for a
Release call.

A target that goes down while a round is in flight need not fail that round: with
`recovery_s` > 0 the call waits (up to recovery_s) while a WorkerReconnector asks `resolve()`
where the target serves now (its supervisor re-forms the group, see actors/target_keeper.py),
then sends the round again with whole histories: the new target re-prefills every sequence
from the router's token history and verifies the same drafts, so the requests finish with
the output they would have had. Without a target by then, the round fails (WorkerError).

`unavailable_reason` says whether the target answers: set when a call or a keep-alive finds
it down (so an idle router notices within a keep-alive period, ttl / 3), cleared by the next
call that succeeds. Health reports NOT_SERVING while it is set.

Not thread-safe: one engine drives it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

import logging

from specdec.requests.errors import WorkerError
from specdec.sampling import grammar_mask
from specdec.sampling.token_logprobs import TokenLogprob
from specdec.verifiers.verifier import Verifier, VerifyRequest, VerifyResult
from specdec_rpc.worker.lease_reaper import DEFAULT_LEASE_TTL_S
from specdec_rpc.worker.prob_codec import wire_q
from specdec_rpc.worker.logprob_messages import from_logprobs
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_client import StreamMethod, WorkerClient


logger = logging.getLogger(__name__)

#: call failures that mean "the worker is down or overloaded", not "a row is bad"
WORKER_DOWN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
PROBE_TIMEOUT_S = 2.0  # one GetInfo while looking for the target again


class ResyncError(RuntimeError):
    """The target asked to resync sequences that were just sent whole (a protocol violation)."""


class RemoteVerifier(WorkerClient, Verifier):
    """Verifies on a remote (tensor-parallel) target; capacity is tracked on this side: slots,
    and, for a paged target, the cache blocks each held sequence reserved (the engine's grant,
    sent with its history every round and grown here, `grow`), out of this client's share of
    the target's blocks.

    Sequence ids travel in the namespace of this client's lease (its id is their prefix),
    so routers that number their sequences alike never share target state.
    """

    stub_class = worker_pb2_grpc.TargetWorkerStub
    round_stream = StreamMethod.of("TargetWorker", "VerifyStream")
    #: every round's Verify goes out on a RoundStream, which runs `after_send`'s parked work
    #: once it is written: the engine loop may park a round's hand-over until then
    sends_on_round_stream = True
    probe_timeout_s = PROBE_TIMEOUT_S  # one GetInfo while looking for the target again

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        slot_budget: int | None = None,
        lease_id: str | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        resolve: Callable[[], str | None] | None = None,
        secret: str | None = None,
        recovery_s: float = 0.0,
    ) -> None:
        """Connects and reads the target's WorkerInfo (waits up to timeout_s for it to be ready).

        slot_budget: the most target slots this client may hold (when several routers
        share one target); None = all of them. lease_id: the router's lease (None = a new
        one); lease_ttl_s: assumed until the target states its own. resolve: where the target
        serves after it went down (None = the same address); recovery_s: how long a round
        waits for it (0 = fail the round at once)."""
        super().__init__(address, timeout_s, lease_id, resolve, secret)
        self.recovery_s = recovery_s
        self.recoveries = 0  # rounds sent again to a target that came back
        self._switched = threading.Event()
        self._held: dict[str, int] = {}  # sequences holding a target slot -> cache blocks they reserved
        info = self._stub.GetInfo(worker_pb2.InfoRequest(), timeout=timeout_s, wait_for_ready=True)
        self.vocab_size = info.vocab_size
        self.max_seq_len = info.max_seq_len
        self.num_slots = info.num_slots if slot_budget is None else min(info.num_slots, slot_budget)
        self._take_block_budget(info)
        self._renew_lease(info.lease_ttl_s or lease_ttl_s)

    def _take_block_budget(self, info: worker_pb2.WorkerInfo) -> None:
        """This client's share of a paged target's blocks (in proportion to its share of the slots);
        requests longer than that share holds could never be admitted, so max_seq_len says so
        (they are refused at entry). An unpaged target (num_blocks 0) is counted in slots only."""
        self.block_size = info.block_size or 1
        self.num_blocks = info.num_blocks * self.num_slots // max(1, info.num_slots)
        self._full_reserve = -(-info.max_seq_len // self.block_size)  # blocks of a sequence without a reserve
        if self.num_blocks:
            self.max_seq_len = min(self.max_seq_len, self.num_blocks * self.block_size)

    def _reserved_blocks(self, reserve_tokens: int | None) -> int:
        return -(-reserve_tokens // self.block_size) if reserve_tokens else self._full_reserve

    @property
    def num_free_slots(self) -> int:
        return self.num_slots - len(self._held)

    @property
    def cache_usage(self) -> float:
        """Share of this client's cache share its held sequences reserved (blocks; slots when unpaged)."""
        if not self.num_blocks:
            return len(self._held) / max(1, self.num_slots)
        return min(1.0, sum(list(self._held.values())) / self.num_blocks)

    num_blocks = 0  # set by __init__ for a paged target; class defaults keep partly built clients (tests) usable

    def admits(self, reserve_tokens: list[int]) -> int:
        """Free slots, and for a paged target the blocks of this client's share not reserved by the
        sequences it holds, taken in order by each new sequence's reserve."""
        count = min(len(reserve_tokens), self.num_free_slots)
        if not self.num_blocks:
            return count
        free = self.num_blocks - sum(self._held.values())
        for taken, reserve in enumerate(reserve_tokens[:count]):
            free -= self._reserved_blocks(reserve)
            if free < 0:
                return taken
        return count

    @property
    def grows_reserves(self) -> bool:
        """A target that counts blocks (or a budget's tokens): grants grow here, within this client's
        share, and reach the target with the sequence's next round (HistoryDelta.reserve_tokens),
        where it raises its reserve before that round writes. The share never exceeds the target's
        blocks, so the target's growth always fits (a target counting slots only: full reserves)."""
        return bool(self.num_blocks)

    def grow(self, reserves: list[tuple[str, int]], taken: list[int]) -> int:
        """Raise held sequences' reserved blocks, in order, while this client's share covers the
        increase after ``taken`` reserves of sequences not sent yet (a sequence not held counts as
        new, on its whole grant); how many were raised. Bookkeeping only: no call (the grant rides
        on the next Verify), so a growth never waits on the target nor fails on its errors."""
        free = self.num_blocks - sum(self._held.values()) - sum(self._reserved_blocks(t) for t in taken)
        for count, (seq_id, tokens) in enumerate(reserves):
            held = self._held.get(seq_id)
            extra = self._reserved_blocks(tokens) - (held or 0)
            if extra > free:
                return count
            free -= max(0, extra)
            if held is not None and extra > 0:
                self._held[seq_id] = held + extra
        return len(reserves)

    runs_concurrently = True  # the target works in its own process: verify_async returns at once
    recovery_s = 0.0  # set by __init__; class defaults keep partly built clients (tests) usable
    recoveries = 0

    def verify(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        return self.verify_async(requests).result()

    def verify_async(self, requests: list[VerifyRequest]) -> "_PendingVerify":
        """Send the Verify call (on the round stream) and return at once; result() waits for the
        outcomes. The buffered releases ride on it (`release_seq_ids`: the target frees them
        before the call's items, and the round waits for no Release call of its own)."""
        self.last_compute_s = 0.0  # the target's compute in this call (RoundProfile)
        if not requests:
            self.flush()
            return _PendingVerify(self, requests, [], None, [])
        for r in requests:  # a grant only grows (`grow`): a first one reserves, a larger one raises
            blocks = self._reserved_blocks(r.reserve_tokens) if self.num_blocks else 0
            self._held[r.seq_id] = max(self._held.get(r.seq_id, 0), blocks)
        items = [self._item(r) for r in requests]
        released = self._take_releases()
        return _PendingVerify(self, requests, items, self._send(items, released), released)

    def _finish(self, requests: list[VerifyRequest], items, future, released: list[str]) -> list[VerifyResult]:
        """The outcomes of a sent call (resyncing sequences the target did not know); when it
        fails, the releases it carried are buffered again (the target may not have applied them;
        it ignores ids it does not know)."""
        if not requests:
            return []
        try:
            return self._outcomes(requests, items, future)
        except BaseException:
            self._keep_releases(released)
            raise

    def _outcomes(self, requests: list[VerifyRequest], items, future) -> list[VerifyResult]:
        deadline = time.monotonic() + self.recovery_s
        while True:
            try:
                response = self._receive(requests, items, future)
                break
            except WorkerError:
                if not self._recovered(deadline):
                    raise
            self.recoveries += 1  # a new target holds nothing: send whole histories
            items = [self._item(r) for r in requests]
            future = self._send(items)
        outcomes = dict(zip((r.seq_id for r in requests), response.outcomes))
        if response.resync_seq_ids:
            resync = {self._sender.local_id(w) for w in response.resync_seq_ids}
            outcomes.update(self._resync(requests, items, resync))
        return [self._result(r, outcomes[r.seq_id]) for r in requests]

    def _recovered(self, deadline: float) -> bool:
        """Wait (until `deadline`) for a target that answers; True once the client uses it."""
        if self.recovery_s <= 0:
            return False
        logger.warning("target %s is unavailable: the round waits up to %.0fs for it", self.address,
                       max(0.0, deadline - time.monotonic()))
        self._switched.clear()
        self.reconnector.trigger()
        while not self._switched.wait(0.1):
            if time.monotonic() > deadline or self.reconnector.gone:
                logger.warning("no target came back (last try: %s)", self.reconnector.last_error)
                return False
        logger.warning("target back at %s: resending the round with whole histories", self.address)
        self._sender.clear()
        return True

    def _switched_to(self, address: str) -> None:
        """A target answers at `address`: the waiting round uses it."""
        self.unavailable_reason = None
        self._switched.set()

    def _item(self, request: VerifyRequest) -> worker_pb2.VerifyItem:
        item = worker_pb2.VerifyItem(
            history=self._sender.delta(request.seq_id, request.token_ids, request.sampling, request.num_prompt_tokens,
                                       request.reserve_tokens),
            draft_token_ids=request.draft_token_ids,
            logprobs=request.logprobs,
            token_mask=grammar_mask.to_bytes(request.token_mask),
            prompt_logprobs=request.prompt_logprobs,
            prompt_logprobs_from=request.prompt_logprobs_from,
        )
        if request.draft_probs is not None and not request.sampling.is_greedy and request.draft_token_ids:
            item.draft_probs.extend(wire_q(request.draft_probs))  # a remote draft's q as it came
        return item

    def _send(self, items: list[worker_pb2.VerifyItem], released: list[str] = ()) -> grpc.Future:
        """The Verify request on the round stream (a StreamCall: the part of a grpc.Future used
        here), freeing the `released` wire ids first."""
        self.lease.touch()
        return self._rounds.send(worker_pb2.VerifyRequest(items=items, lease_id=self.lease.lease_id,
                                                          release_seq_ids=released))

    def _call(self, requests: list[VerifyRequest], items: list[worker_pb2.VerifyItem]) -> worker_pb2.VerifyResponse:
        return self._receive(requests, items, self._send(items))

    def _receive(self, requests: list[VerifyRequest], items, future: grpc.Future) -> worker_pb2.VerifyResponse:
        """Wait for one Verify call; after a failure its sequences resend their whole history."""
        try:
            response = future.result()
        except grpc.RpcError as exc:
            self._sender.reset(r.seq_id for r in requests)
            if exc.code() in WORKER_DOWN:
                self.unavailable_reason = f"target {self.address} is unavailable ({exc.code().name}: {exc.details()})"
                raise WorkerError(self.unavailable_reason) from exc
            raise
        self.unavailable_reason = None
        self.last_compute_s += response.compute_seconds
        if len(response.outcomes) != len(items):
            self._sender.reset(r.seq_id for r in requests)
            raise RuntimeError(f"target {self.address} answered {len(response.outcomes)} outcomes for {len(items)}")
        return response

    def _resync(self, requests: list[VerifyRequest], items: list[worker_pb2.VerifyItem], seq_ids: set[str]):
        """Send the given sequences again with their whole history; returns their outcomes by seq_id."""
        self._sender.reset(seq_ids)
        again, retry = [], []
        for request, item in zip(requests, items):
            if request.seq_id in seq_ids:
                full = worker_pb2.VerifyItem()
                full.CopyFrom(item)
                full.history.CopyFrom(self._sender.delta(request.seq_id, request.token_ids, request.sampling,
                                                         request.num_prompt_tokens, request.reserve_tokens))
                again.append(request)
                retry.append(full)
        response = self._call(again, retry)
        if response.resync_seq_ids:
            self._sender.reset(r.seq_id for r in again)
            raise ResyncError(f"target {self.address} asked to resync whole histories: {list(response.resync_seq_ids)}")
        return {request.seq_id: outcome for request, outcome in zip(again, response.outcomes)}

    def _result(self, request: VerifyRequest, outcome: worker_pb2.VerifyOutcome) -> VerifyResult:
        emitted = list(outcome.emitted_token_ids)
        if outcome.seq_id != self._sender.wire_id(request.seq_id) or len(emitted) != outcome.num_accepted + 1:
            raise RuntimeError(f"bad outcome for {request.seq_id!r}: {outcome}")
        if outcome.num_accepted > len(request.draft_token_ids):
            raise RuntimeError(f"outcome of {request.seq_id!r} accepts more tokens than were drafted")
        return VerifyResult(request.seq_id, emitted, outcome.num_accepted, _logprobs(request, outcome, emitted),
                            outcome.cached_tokens, _prompt_logprobs(request, outcome))

    def release(self, seq_id: str) -> None:
        """Frees the slot on this side at once; the Release call is sent before the next call."""
        self._held.pop(seq_id, None)
        super().release(seq_id)

    def flush(self) -> None:
        """Send buffered releases now (raises grpc.RpcError; the ids stay buffered then)."""
        seq_ids = self._take_releases()
        if not seq_ids:
            return
        try:
            self._stub.Release(self._release_request(seq_ids), timeout=self.timeout_s)
        except BaseException:
            self._keep_releases(seq_ids)
            raise

    def _keep_alive(self, lease_id: str) -> float:
        """One KeepAlive; a target found down (or back) sets (or clears) unavailable_reason."""
        try:
            ttl_s = super()._keep_alive(lease_id)
        except grpc.RpcError as exc:
            if exc.code() in WORKER_DOWN:
                self.unavailable_reason = f"target {self.address} is unavailable ({exc.code().name}: {exc.details()})"
            raise
        self.unavailable_reason = None
        return ttl_s


class _PendingVerify:
    """A Verify call in flight (see RemoteVerifier.verify_async)."""

    def __init__(self, owner: RemoteVerifier, requests: list[VerifyRequest], items, future,
                 released: list[str]) -> None:
        self._owner, self._requests, self._items, self._future = owner, requests, items, future
        self._released = released  # the wire ids whose release the call carries

    def result(self) -> list[VerifyResult]:
        return self._owner._finish(self._requests, self._items, self._future, self._released)


def _logprobs(request: VerifyRequest, outcome: worker_pb2.VerifyOutcome,
              emitted: list[int]) -> list[TokenLogprob] | None:
    """The emitted tokens' logprobs when the request asked for them (one per emitted token)."""
    if request.logprobs is None:
        return None
    if len(outcome.logprobs) != len(emitted):
        raise RuntimeError(f"outcome of {request.seq_id!r}: {len(outcome.logprobs)} logprobs, {len(emitted)} tokens")
    if [lp.token_id for lp in outcome.logprobs] != emitted:
        raise RuntimeError(f"outcome of {request.seq_id!r}: logprobs of other tokens than those emitted")
    return from_logprobs(outcome.logprobs)


def _prompt_logprobs(request: VerifyRequest, outcome: worker_pb2.VerifyOutcome) -> list[TokenLogprob | None] | None:
    """The history tokens' logprobs the request asked for (None first when they start at
    position 0, which has none)."""
    if request.prompt_logprobs is None:
        return None
    first, last = request.prompt_logprobs_from, len(request.token_ids) - 1
    expected = request.token_ids[max(first, 1): last + 1]
    if [lp.token_id for lp in outcome.prompt_logprobs] != expected:
        raise RuntimeError(f"outcome of {request.seq_id!r}: prompt logprobs of other tokens than its history's")
    return ([None] if first == 0 else []) + from_logprobs(outcome.prompt_logprobs)
