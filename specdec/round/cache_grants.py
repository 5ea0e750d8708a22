"""CacheGrants: how much cache each request holds a claim to, granted as it grows (with preemption).

Admitting each request on its full reserve (prompt + max_new_tokens) keeps most blocks owed
to tokens not generated yet: with mixed prompt lengths nearly all blocks are reserved while
few are written. Here (as vLLM does) a request is admitted on what its next round can write
(its history, the round's γ + 1 tokens) plus a small watermark, and its grant grows before
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

from collections.abc import Iterable

from specdec.requests.sequence import Sequence

WATERMARK_TOKENS = 16  # granted beyond a round's need, so a grant grows every few rounds, not every round


class CacheGrants:
    """The reserve each running request may grow to, and when it must grow."""

    def __init__(self, round_tokens: int, watermark: int = WATERMARK_TOKENS) -> None:
        """round_tokens: the most tokens one round appends to a row's cache beyond its history
        (γ limit + 1: the pending token and the drafted ones)."""
        if round_tokens < 1 or watermark < 0:
            raise ValueError(f"round_tokens={round_tokens} must be >= 1 and watermark={watermark} >= 0")
        self.round_tokens, self.watermark = round_tokens, watermark

    def needed(self, seq: Sequence) -> int:
        """The reserve the row's next round needs (its history and one round, at most its maximum)."""
        return min(seq.max_tokens, len(seq.token_ids) + self.round_tokens)

    def step(self, seq: Sequence) -> int:
        """The reserve to grant when the row needs more: its next round and the watermark."""
        return min(seq.max_tokens, len(seq.token_ids) + self.round_tokens + self.watermark)

    def short(self, running: Iterable[Sequence]) -> list[tuple[Sequence, int]]:
        """The rows whose grant the next round could pass, each with the grant it should get."""
        return [(seq, self.step(seq)) for seq in running if seq.reserve_tokens < self.needed(seq)]

    def admission(self, seq: Sequence) -> int:
        """The reserve a waiting request is admitted on."""
        return self.step(seq)

    @staticmethod
    def reset(seq: Sequence) -> None:
        """A preempted request: it holds nothing; its next admission grants afresh."""
        seq.granted_tokens = None
        seq.prefilled, seq.chunk_end = 0, None
