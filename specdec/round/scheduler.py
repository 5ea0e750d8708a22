"""Scheduler: which requests wait and which run, and who joins or leaves the batch each step.

Waiting requests join while the verifier's cache can reserve them (blocks of a paged target,
else slots): in arrival order, except that one that fits may pass one that does not, a
bounded amount (`Admission`). The reserve is prompt + max_new_tokens, or, where the verifier
grows reserves, the next round's need (`CacheGrants`): running rows grow first, and when the
cache cannot cover them the most recently admitted one is preempted (its cache freed, queued
first, its history read again later); a step that preempts admits nothing. A row whose
growth raises is failed alone (`admit` returns it, ended with its error, its cache freed). A running request
takes its cache at its first verification, which may come a step later (micro-batches):
those are counted as taken already (`placed`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from specdec.requests.sequence import Sequence
from specdec.round.admission import Admission
from specdec.round.cache_grants import CacheGrants
from specdec.round.round_output import RoundOutput
from specdec.round.row_outcome import fail_row
from specdec.verifiers.verifier import Verifier

logger = logging.getLogger(__name__)


class Scheduler:
    """The waiting queue and the running batch of one engine.

    round_tokens: the most tokens one round writes per row (γ limit + 1); chunk_budget: the
    prompt tokens a round reads (None: whole prompts). `release` frees a request's cache in
    both models (the engine's)."""

    def __init__(self, round_tokens: int, chunk_budget: int | None, release: Callable[[Sequence], None]) -> None:
        self.admission = Admission()
        self.grants = CacheGrants(round_tokens, chunk_budget)
        self.preemptions = 0  # running requests sent back to the queue for lack of cache
        self.placed: set[str] = set()  # running requests the target has taken (cache allocated)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._release = release

    def active(self) -> list[Sequence]:
        return [*self.waiting, *self.running]

    def admit(self, verifier: Verifier) -> list[tuple[Sequence, RoundOutput]]:
        """Grow the running rows' grants (preempting when short), then let waiting requests join.
        Returns the rows failed because their growth raised (ended, cache freed), with their outputs."""
        failed: list[tuple[Sequence, RoundOutput]] = []
        growing = getattr(verifier, "grows_reserves", False)  # read each step: a verifier may be wrapped
        if growing and self.grants.make_room(self.running, self.placed, verifier, self.preempt,
                                             lambda seq, exc: failed.append(self._fail(seq, exc))):
            return failed
        self._join(verifier, growing)
        return failed

    def _join(self, verifier: Verifier, growing: bool) -> None:
        """Let waiting requests join while the verifier's cache can reserve them."""
        if not self.waiting:  # most steps: nothing to choose from (and nothing passed over to count)
            return
        unseen = [seq.reserve_tokens for seq in self.running if seq.seq_id not in self.placed]
        waiting = list(self.waiting)
        reserve = self.grants.admission if growing else (lambda seq: seq.reserve_tokens)
        chosen = self.admission.choose(verifier.admits, unseen, [(s.seq_id, reserve(s)) for s in waiting])
        if not chosen:
            return
        for i in chosen:
            if growing:
                waiting[i].granted_tokens = reserve(waiting[i])
            if waiting[i].started_at is None:  # a resumed request keeps its first start
                waiting[i].started_at = time.monotonic()
            self.running.append(waiting[i])
        admitted = set(chosen)
        self.waiting = deque(seq for i, seq in enumerate(waiting) if i not in admitted)

    def _fail(self, seq: Sequence, exc: Exception) -> tuple[Sequence, RoundOutput]:
        """End a running request with its error: out of the batch, its cache freed in both models."""
        logger.warning("request %s failed: its cache grant could not grow: %s: %s", seq.seq_id,
                       type(exc).__name__, exc)
        self.running.remove(seq)
        self.placed.discard(seq.seq_id)
        output = fail_row(seq, exc)
        try:
            self._release(seq)
        except Exception:  # noqa: BLE001 - its leases free what a failed release left
            logger.exception("releasing %s failed", seq.seq_id)
        return seq, output

    def preempt(self, seq: Sequence) -> None:
        """Free the request's cache in both models and queue it first; its history (prompt and
        generated tokens) is read again when it is admitted again."""
        logger.debug("preempting %s (%d tokens) for lack of cache", seq.seq_id, len(seq.token_ids))
        self.running.remove(seq)
        self.placed.discard(seq.seq_id)
        self._release(seq)
        self.grants.reset(seq)
        seq.preempted = True
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def remove(self, seq: Sequence) -> bool:
        """Take a finished or aborted request out; True when it was running (it holds cache)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            self.admission.forget(seq.seq_id)
        running = seq in self.running
        if running:
            self.running.remove(seq)
        self.placed.discard(seq.seq_id)
        return running
