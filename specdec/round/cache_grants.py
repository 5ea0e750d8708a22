"""CacheGrants: how much cache each request holds a claim to, granted as it grows (with preemption).

Admitting each request on its full reserve (prompt + max_new_tokens) keeps most blocks owed
to tokens not generated yet: with mixed prompt lengths nearly all blocks are reserved while
few are written. Here (as vLLM does) a request is admitted on what its next round can write
(its history, or with chunked prefill its prompt's first chunk, and the round's γ + 1 tokens)
plus a small watermark, and its grant grows before
each round, in admission order, by the same step when the round could pass it. When the
cache cannot cover a growth, the most recently admitted running request is *preempted*: both
models free its blocks, it goes back to the front of the queue with its history (prompt and
the tokens generated so far), and when admitted again the target and the draft read that
history anew (mostly from the prefix cache: its full blocks were indexed as it decoded).

Exactness: a row's tokens depend on its history only (greedy: the target's argmax; seeded:
draws keyed by the request's seed and the history position, `specdec.sampling.counter_rng`),
so a preempted and resumed request emits the tokens it would have without preemption; the
engine keeps its outputs, stop state and statistics, so a stream sees each token once.
A request whose full reserve fits the cache alone never fails for lack of blocks: the oldest
running request is never preempted for a younger one, and once it is alone it holds every block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from specdec.requests.errors import WorkerError
from specdec.requests.sequence import Sequence
from specdec.verifiers.verifier import Verifier

logger = logging.getLogger(__name__)

WATERMARK_TOKENS = 16  # granted beyond a round's need, so a grant grows every few rounds, not every round


class CacheGrants:
    """The reserve each running request may grow to, and when it must grow."""

    def __init__(self, round_tokens: int, chunk_tokens: int | None = None, watermark: int = WATERMARK_TOKENS) -> None:
        """round_tokens: the most tokens one round appends to a row's cache beyond its history
        (γ limit + 1: the pending token and the drafted ones); chunk_tokens: the most prompt
        tokens one round reads for a row (chunked prefill's budget; None: whole prompts)."""
        if round_tokens < 1 or watermark < 0 or (chunk_tokens is not None and chunk_tokens < 1):
            raise ValueError(f"round_tokens={round_tokens} and chunk_tokens={chunk_tokens} must be >= 1, "
                             f"watermark={watermark} >= 0")
        self.round_tokens, self.chunk_tokens, self.watermark = round_tokens, chunk_tokens, watermark

    def _next_round(self, seq: Sequence) -> int:
        """The most tokens the row's cache holds after its next round: its history and one round;
        a prompt read in chunks, only its next chunk (a row not yet decoding reads its prompt
        from what earlier chunks read)."""
        end = len(seq.token_ids) + self.round_tokens
        if self.chunk_tokens is not None and seq.stats.rounds == 0:
            end = min(end, seq.prefilled + self.chunk_tokens + self.round_tokens)
        return end

    def needed(self, seq: Sequence) -> int:
        """The reserve the row's next round needs (at most the request's maximum)."""
        return min(seq.max_tokens, self._next_round(seq))

    def step(self, seq: Sequence) -> int:
        """The reserve to grant when the row needs more: its next round and the watermark."""
        return min(seq.max_tokens, self._next_round(seq) + self.watermark)

    def short(self, running: Iterable[Sequence]) -> list[tuple[Sequence, int]]:
        """The rows whose grant the next round could pass, each with the grant it should get."""
        return [(seq, self.step(seq)) for seq in running if seq.reserve_tokens < self.needed(seq)]

    def make_room(self, running: list[Sequence], placed: set[str], verifier: Verifier,
                  preempt: Callable[[Sequence], None], fail: Callable[[Sequence, Exception], None]) -> bool:
        """Grow the grants the next round could pass, oldest request first (``running`` is in
        admission order; ``placed``: the ids whose cache the target holds, the others count as
        new). While the cache cannot cover them, preempt the most recently admitted request
        (``preempt`` frees it and takes it out of ``running``), never the last one running:
        alone it fits (its full reserve was checked at entry). A row whose growth raises is
        failed alone (``fail`` ends it with the error and takes it out). True if one was preempted."""
        preempted = False
        while short := self.short(running):
            unseen = [seq.reserve_tokens for seq in running if seq.seq_id not in placed]
            grown = self._grow(short, unseen, verifier, fail)
            for seq, tokens in short[:grown]:
                seq.granted_tokens = tokens
            if grown == len(short) or len(running) <= 1:
                break
            preempt(running[-1])
            preempted = True
        return preempted

    @staticmethod
    def _grow(short: list[tuple[Sequence, int]], unseen: list[int], verifier: Verifier,
              fail: Callable[[Sequence, Exception], None]) -> int:
        """How many of ``short`` grew, in order. When the verifier's growth raises (other than a
        target that is down: that fails the step, as a round would), each row grows alone and a
        row whose growth raises is failed (counted as grown: it needs nothing any more), so one
        row's error ends that row, not every stream."""
        try:
            return verifier.grow([(seq.seq_id, tokens) for seq, tokens in short], unseen)
        except WorkerError:
            raise
        except Exception as exc:  # noqa: BLE001 - isolated below, row by row
            logger.warning("growing %d grants failed (%s: %s): growing them one at a time", len(short),
                           type(exc).__name__, exc)
        for count, (seq, tokens) in enumerate(short):
            try:
                if verifier.grow([(seq.seq_id, tokens)], unseen) < 1:
                    return count
            except WorkerError:
                raise
            except Exception as exc:  # noqa: BLE001 - this row's error ends this row
                fail(seq, exc)
        return len(short)

    def admission(self, seq: Sequence) -> int:
        """The reserve a waiting request is admitted on."""
        return self.step(seq)

    @staticmethod
    def reset(seq: Sequence) -> None:
        """A preempted request: it holds nothing; its next admission grants afresh."""
        seq.granted_tokens = None
        seq.prefilled, seq.chunk_end = 0, None
