"""PrefillPace: how many prompt tokens a round may read while other rows decode.

A fixed token budget per round (`prefill_chunk_tokens`) stalls the decoding rows by whatever
those tokens cost on this hardware: on a GPU a chunk of a few hundred tokens costs little
more than a decode step, on a CPU as much as many decode rounds. The pace measures instead
what a round without prompt tokens takes (a decode round) and what each prompt token adds
to a round, and sizes the chunk so that prompts lengthen the decode rounds by at most
`slowdown` on average and each round by at most twice that (Sarathi-Serve's stall-free
batching, its budget derived from measured costs instead of fixed). The average is kept by
a credit: every round earns `slowdown` × a decode round's time, a round that reads prompt
tokens spends what they added, and a chunk is read only while the credit is not negative.
Whatever it costs, a chunk of at least `min_tokens` is read on credit, so every prompt
progresses. With no row decoding there is nothing to stall: the caller reads at its budget.
"""

from __future__ import annotations

MIN_TOKENS = 16  # the smallest chunk read on credit (a cache block on the default config)
WEIGHT = 0.3  # weight of the newest sample in the running averages
CREDIT_ROUNDS = 4  # the most rounds' earnings saved up (no bursts)
DEBT_ROUNDS = 10  # the largest debt kept, in decode rounds


class PrefillPace:
    """Measured pacing of prompt chunks beside decoding rows (times in seconds)."""

    def __init__(self, slowdown: float, min_tokens: int = MIN_TOKENS) -> None:
        """slowdown: how much prompts may lengthen the decode rounds on average (0.2 = 20 %)."""
        if slowdown <= 0:
            raise ValueError(f"slowdown must be > 0, got {slowdown}")
        self.slowdown = slowdown
        self.min_tokens = min_tokens
        self.decode_s: float | None = None  # a round without prompt tokens
        self.token_s: float | None = None  # what one prompt token adds to a round
        self.credit_s = 0.0
        self._last = min_tokens  # the last chunk's size (a chunk grows at most 2x per round)
        self._unmeasured = False  # a chunk was read before any decode round was measured

    def allowance(self) -> int:
        """Prompt tokens this round may read while rows decode (0: not this round)."""
        if self.credit_s < 0 or (self.decode_s is None and self._unmeasured):
            return 0  # paying back, or a decode round is to be measured first
        if self.decode_s is None or self.token_s is None or self.token_s <= 0:
            return self.min_tokens
        fits = int(2 * self.slowdown * self.decode_s / self.token_s)  # the per-round stall cap
        return max(self.min_tokens, min(fits, 2 * self._last))

    def record(self, seconds: float, prompt_tokens: int) -> None:
        """A round beside decoding rows took `seconds` and read `prompt_tokens` prompt tokens."""
        if prompt_tokens == 0:
            self.decode_s = _average(self.decode_s, seconds)
            self._earn(0.0)
            return
        self._last = prompt_tokens
        if self.decode_s is None:  # nothing to compare with yet
            self._unmeasured = True
            return
        added = max(0.0, seconds - self.decode_s)
        self.token_s = _average(self.token_s, added / prompt_tokens)
        self._earn(added)

    def _earn(self, spent: float) -> None:
        """Earn a round's share, spend what its prompt tokens added: at most CREDIT_ROUNDS
        rounds' earnings are saved (no bursts), a debt of at most DEBT_ROUNDS decode rounds is
        kept (one round slowed by something else must not stop the prompts for long)."""
        decode_s = self.decode_s or 0.0
        earned = self.slowdown * decode_s
        self.credit_s = min(CREDIT_ROUNDS * earned, max(-DEBT_ROUNDS * decode_s, self.credit_s + earned - spent))


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - WEIGHT) * old + WEIGHT * new
