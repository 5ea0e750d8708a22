"""MirroredRunner: rank 0's ModelRunner API, with every state change replayed on the other ranks.

A tensor-parallel target is one model split over ranks; every rank must run the same
forward over the same cache slots (the row-parallel all-reduces keep them in lockstep).
The leader's TargetVerifier drives a MirroredRunner: it applies each allocate / free /
grow_reserves / truncate locally at once and queues it; a forward sends the queued operations
with the forward itself as ONE call to each follower actor (`TargetFollower.step`), which
applies them in order and then runs the forward. A follower's cache thus goes through exactly
the leader's operations before every forward (the only point where the ranks must agree),
and it checks that it hands out the same slot ids and raises the same reserves. One actor
call per follower per forward, not one per operation: each call costs a Ray submission, a
wake-up of the follower and a reply, which on the group's critical path added up to more
than the rest of a round (docs/emulated_devices.md). The leader runs its own forward while
the followers run theirs, and waits for them before returning (their errors surface there).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from specdec.models.model_runner import ModelRunner
from specdec_rpc.worker.worker_runtime import WorkerLost

logger = logging.getLogger(__name__)
MAX_QUEUED_OPS = 256  # cache operations queued without a forward before they are sent on their own


class MirroredRunner:
    """Duck-types ModelRunner for TargetVerifier. Not thread-safe: one caller (the servicer's worker thread)."""

    def __init__(self, runner: ModelRunner, followers: list[Any]) -> None:
        self.runner = runner
        self.followers = list(followers)
        self.vocab_size = runner.vocab_size
        self.max_seq_len = runner.max_seq_len
        self.runner_kind = runner.runner_kind
        self._pending: list[ray.ObjectRef] = []  # follower calls not yet confirmed
        self._ops: list[tuple[str, tuple]] = []  # cache operations the followers have not been sent yet

    @property
    def num_free_slots(self) -> int:
        return self.runner.num_free_slots

    def slot_length(self, slot: int) -> int:
        return self.runner.slot_length(slot)

    def allocate_slot(self, reserve_tokens: int | None = None) -> int:
        slot = self.runner.allocate_slot(reserve_tokens)
        self._mirror("allocate_slot", slot, reserve_tokens)  # followers must hand out the same id
        return slot

    def admits(self, reserve_tokens: list[int | None]) -> int:
        return self.runner.admits(reserve_tokens)  # every rank's cache holds the same blocks

    def grow_reserves(self, reserves: list[tuple[int, int]], taken: list[int | None] = ()) -> int:
        """Raise reserves on every rank: the followers grow the same prefix (they check the count),
        so each rank's cache keeps owing the same blocks and hands out the same ones."""
        grown = self.runner.grow_reserves(reserves, taken)
        if grown:
            self._mirror("grow_reserves", reserves[:grown], grown)
        return grown

    @property
    def cache_usage(self) -> float:
        return self.runner.cache_usage

    @property
    def block_capacity(self) -> tuple[int, int]:
        return self.runner.block_capacity

    def cached_tokens(self, slot: int) -> int:
        return self.runner.cached_tokens(slot)

    def free_slot(self, slot: int) -> None:
        self.runner.free_slot(slot)
        self._mirror("free_slot", slot)

    def truncate(self, slot: int, length: int) -> None:
        self.runner.truncate(slot, length)
        self._mirror("truncate", slot, length)

    def forward(self, slot_ids: list[int], token_ids: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """The same forward on every rank at once (each follower first applies the queued
        cache operations); returns the leader's logits."""
        self._send((slot_ids, token_ids, last_only))
        try:
            logits = self.runner.forward(slot_ids, token_ids, last_only)
        except BaseException as exc:
            self._drain()  # the followers fail the same way (their state is identical), or one died
            raise exc
        self.sync()
        return logits

    def sync(self) -> None:
        """Send the queued cache operations and wait for every follower call so far; raises the
        first follower error (WorkerLost when a follower died: the group must be re-formed)."""
        if self._ops:
            self._send(None)
        pending, self._pending = self._pending, []
        if pending:
            try:
                ray.get(pending)
            except RayActorError as exc:
                raise WorkerLost(f"a follower rank of the target group died: {type(exc).__name__}") from exc

    def _drain(self) -> None:
        """After the leader's own forward failed: WorkerLost if a follower died, else log theirs."""
        try:
            self.sync()
        except WorkerLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the leader's own error is the one to report
            logger.warning("follower ranks failed too: %s", exc)

    def _mirror(self, method: str, *args: Any) -> None:
        """Queue a cache operation for the followers; a long queue (no forward for a while) is sent."""
        self._ops.append((method, args))
        if len(self._ops) >= MAX_QUEUED_OPS:
            self._send(None)

    def _send(self, forward: tuple | None) -> None:
        """One call per follower: the queued operations, then `forward`'s arguments (None: none)."""
        ops, self._ops = self._ops, []
        for follower in self.followers:
            self._pending.append(follower.step.remote(ops, forward))
