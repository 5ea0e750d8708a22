"""PrefillPace: how many prompt tokens a round may read while other rows decode.

A fixed token budget per round (`prefill_chunk_tokens`) stalls the decoding rows by whatever
those tokens cost on this hardware: on a GPU a chunk of a few hundred tokens costs little
more than a decode step, on a CPU as much as many decode rounds. The pace measures instead
what a round without prompt tokens takes (a decode round) and what a chunk adds to a round,
and reads chunks so that prompts lengthen the decode rounds by at most `slowdown` on average
and each round by at most twice that (Sarathi-Serve's stall-free batching, its budget derived
from measured times instead of fixed). The average is kept by a credit: every round earns
`slowdown` × a decode round's time, a round that reads prompt tokens spends what they added,
and a chunk is read only while the credit is not negative.

Two sizes of chunk cost very differently. A chunk no longer than the round's widest verify
row (its γ + 1 tokens, at least `MIN_TOKENS`: the `floor`) *rides* the decode rows' own
forward (`TargetVerifier._sync`): it costs its tokens and their attention, not another pass
over the weights. A wider chunk needs a forward of its own, on a CPU a third of a decode
round before it reads a token. So a chunk is the floor, which always progresses, unless the
riding chunks leave most of the per-round cap unused (a GPU): then wider chunks are tried,
priced per token from their own measured rounds, and grow at most 2× per round. With no row
decoding there is nothing to stall: the caller reads at its budget.
"""

from __future__ import annotations

MIN_TOKENS = 4  # the smallest chunk (the floor when the rows decode without speculation)
WEIGHT = 0.3  # weight of the newest sample in the running averages
CREDIT_ROUNDS = 4  # the most rounds' earnings saved up (no bursts)
DEBT_ROUNDS = 10  # the largest debt kept, in decode rounds
WIDE_HEADROOM = 0.25  # wider chunks are tried only while a riding one adds at most this share of the cap


class PrefillPace:
    """Measured pacing of prompt chunks beside decoding rows (times in seconds)."""

    def __init__(self, slowdown: float, min_tokens: int = MIN_TOKENS) -> None:
        """slowdown: how much prompts may lengthen the decode rounds on average (0.2 = 20 %)."""
        if slowdown <= 0:
            raise ValueError(f"slowdown must be > 0, got {slowdown}")
        self.slowdown = slowdown
        self.min_tokens = min_tokens
        self.floor = min_tokens  # this round's riding chunk (`allowance`'s width)
        self.decode_s: float | None = None  # a round without prompt tokens
        self.ride_s: float | None = None  # what a riding chunk adds to a round
        self.wide_token_s: float | None = None  # what a wider chunk adds per token
        self.credit_s = 0.0
        self._last = min_tokens  # the last chunk's size (a wide chunk grows at most 2x per round)
        self._unmeasured = False  # a chunk was read before any decode round was measured

    def allowance(self, width: int = 1) -> int:
        """Prompt tokens this round may read while rows decode (0: not this round). width: the
        round's widest verify row (γ + 1), what a chunk may read riding the decode rows' forward."""
        self.floor = max(self.min_tokens, width)
        if self.credit_s < 0 or (self.decode_s is None and self._unmeasured):
            return 0  # paying back, or a decode round is to be measured first
        if self.decode_s is None or self.ride_s is None:
            return self.floor
        cap = 2 * self.slowdown * self.decode_s  # what a chunk may add to one round
        if self.ride_s > WIDE_HEADROOM * cap:
            return self.floor  # a riding chunk uses much of the cap: a forward of its own would exceed it
        grown = 2 * max(self._last, self.floor)  # a wide chunk at most doubles
        if self.wide_token_s is None or self.wide_token_s <= 0:
            return grown if self.wide_token_s is not None else 2 * self.floor  # unpriced: try one wider chunk
        return max(self.floor, min(int(cap / self.wide_token_s), grown))

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
        if prompt_tokens <= self.floor:
            self.ride_s = _average(self.ride_s, added)
        else:
            self.wide_token_s = _average(self.wide_token_s, added / prompt_tokens)
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
