"""How a step's rounds overlap drafting with verifying: chosen from measurements, not assumed.

Drafting ahead (`specdec.round.draft_ahead`) has three ways to run a step:

* `SEQUENTIAL`: propose, then verify (no overlap);
* `LOOK_AHEAD`: while the target verifies the rows, the draft drafts their next round for
  the likeliest verdicts;
* `MICRO_BATCHES` (several rows): while the target verifies one half of the rows, the draft
  drafts for the other half; the halves take turns.

Which is fastest depends on the hardware and the load: overlapping pays only where the
draft really runs next to the verify (a free core or device each); a look-ahead pays only
when its verdicts hit often enough; micro-batches pay only where a half batch costs the
target clearly less than a whole one (compute-bound batches). So steps run in *blocks* of
rounds, each block one way, and the choice follows the measured emitted tokens per second
of each way:

* a way never measured is measured first (in the order given: the likeliest first), unless
  what other kinds of step measured (`presumed`: each way's rate over sequential rounds at
  the nearest number of rows) says it is slower by more than `margin`: measuring a slower
  way costs the rounds it runs, and a short run of a new kind of step would pay mostly for
  that. A way presumed faster by more than `margin` runs first;
* a way is judged against the kept one (at first: the first way) in *pairs*: its block
  against the kept way's rounds just before and just after it (as many as the block has),
  so that both see the same requests and the same host (a request's text moves a way's
  rate: comparing blocks far apart mostly compares requests; docs/drafting_ahead.md). Each pair gives
  log(its rate / the kept way's); another way takes over only when the mean over its pairs
  beats the kept way by more than `margin` plus `CONFIDENCE` standard errors, after at least
  `MIN_PAIRS` pairs (one noisy pair does not flip the choice);
* the others run a block again every `explore_every` blocks of the kept way; once none could
  plausibly beat it by the margin (settled: its pairs' mean plus `CONFIDENCE` standard errors
  stays below it), each such block that confirms the kept way doubles the wait (at most
  `MOST_BACKOFF` times `explore_every`); it starts over when the kept way changes. The pairs
  are noisy enough that a way well ahead takes several explorations to be clear: the first
  way is the prior (a lone row's look-ahead, several rows' sequential rounds), so a noisy
  block never flips it, and leaving it where it is wrong takes longer than a block rule did;
* a block of a way other than the kept one lasts a third of `block_rounds` (at least 2 rounds); the first round
  after a change of way is not counted (it carries the other way's state: a look-ahead step
  after sequential ones has nothing drafted ahead, a sequential step after look-aheads may
  find its drafts made ahead), which in blocks this short would bias each pair;
* each way's rate (reported, and what other kinds presume) is an exponentially weighted mean
  over its blocks (`weight` for the newest); older pairs count `PAIR_KEEP` less at each new
  one, so the choice follows the host and the requests as they change;
* **a fast exit**: where the kept way's rounds say what sequential rounds would have emitted on
  the same text (`record`'s `sequential_tokens`, `SequentialEstimate`), sequential rounds' rate
  is predicted from that and their measured time per round, which hardly depends on the text,
  so the text's noise is shared by both sides. When the prediction beats the kept way's
  measured rate by more than `EXIT_MARGIN` at the end of `EXIT_BLOCKS` kept blocks in a row,
  sequential rounds take over at once, without waiting for pairs: a lone row's look-ahead that
  really loses (a host without a free core) is left within a few blocks, where the pairs would
  keep it for hundreds of rounds. Where it wins or ties, the prediction never leads by that much,
  and the pairs decide as before. The same prediction ends an exploration of a look-ahead or of
  micro-batches early (after `EARLY_ROUNDS` counted rounds) where sequential rounds lead it by
  twice the margin: several rows' overlapped ways lose clearly on a busy host
  (docs/drafting_ahead.md), and the first kind of several rows measures each once before the
  pairs rule them out.

`DraftAhead` keeps one choice per kind of step (how many rows, greedy or sampled) and shares
the measured ratios between the kinds of several rows. Which way a round runs never changes
what is emitted (every way is exact), only how fast.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES = "sequential", "look-ahead", "micro-batches"
MOST_BACKOFF = 8  # the longest wait between two explorations, in units of explore_every
CONFIDENCE = 2.0  # standard errors by which a way must lead the kept one to take over (or to be ruled out)
PAIR_KEEP = 0.9  # an older pair's weight relative to the next one
MIN_PAIRS = 4  # a spread of fewer pairs is no measure of the noise: no way is clearly faster before
EXIT_MARGIN = 0.1  # how far sequential rounds' predicted rate must lead the kept way's to leave it at once
EXIT_BLOCKS = 3  # ... at the end of this many kept blocks in a row
EARLY_ROUNDS = 3  # counted rounds before an exploration may end early (twice EXIT_MARGIN behind the prediction)


@dataclass
class Pairs:
    """A way's pairs against the kept way: the weighted mean of log(its rate / the kept way's)
    and that mean's standard error (infinite before MIN_PAIRS pairs)."""

    count: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    pairs: int = 0

    def add(self, log_ratio: float) -> None:
        self.pairs += 1
        self.count = PAIR_KEEP * self.count + 1
        self.total = PAIR_KEEP * self.total + log_ratio
        self.squares = PAIR_KEEP * self.squares + log_ratio * log_ratio

    def negated(self) -> Pairs:
        return Pairs(self.count, -self.total, self.squares, self.pairs)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @property
    def error(self) -> float:
        if self.pairs < MIN_PAIRS:
            return math.inf
        spread = max(0.0, self.squares - self.count * self.mean ** 2) / (self.count - 1)
        return math.sqrt(spread / self.count)


def _rate(rounds) -> float | None:
    seconds = sum(s for _, s in rounds)
    return sum(t for t, _ in rounds) / seconds if seconds > 0 else None


@dataclass
class OverlapChoice:
    """ways: the ways to choose from, the one to keep until another is clearly faster first;
    block_rounds: rounds per block of the kept way; explore_every: once settled, every this
    many blocks a slower way runs one block again; weight: share of the newest block in a
    way's rate; presumed: way -> its rate over sequential rounds as measured for other kinds
    of step (None: unknown); margin: how much faster a way must be (measured, or presumed) to
    take over or to be tried first."""

    ways: tuple[str, ...] = (LOOK_AHEAD, SEQUENTIAL)
    block_rounds: int = 24
    explore_every: int = 6
    weight: float = 0.5
    presumed: dict[str, float | None] = field(default_factory=dict)
    margin: float = 0.03
    way: str = ""  # this block's way (the first to try until measured)
    rates: dict[str, float | None] = field(default_factory=dict)  # way -> emitted tokens/s
    pairs: dict[str, Pairs] = field(default_factory=dict)  # way -> its pairs against the kept way
    changes: int = 0  # times the chosen way changed
    _block: list = field(default_factory=list)  # this block's rounds: (tokens, seconds)
    _rounds: int = 0
    _before: deque = field(default_factory=deque)  # the kept way's latest rounds
    _pending: tuple | None = None  # (way, its block's rate, the kept rounds before it, after it)
    _blocks_since_explore: int = 0
    _explore_gap: int = 0  # blocks between two explorations now (explore_every, doubling)
    _explored: int = 0  # explorations so far (which slower way is next)
    _kept: str = ""  # the way believed fastest (the first to try until measured)
    _changed: bool = False  # this block's way differs from the last one's
    sequential_round_s: float | None = None  # sequential rounds' seconds per round (weighted like the rates)
    _predicted: deque = field(default_factory=deque)  # the kept way's latest (tokens, seconds, sequential tokens)
    _behind: int = 0  # kept blocks in a row whose prediction says sequential rounds are clearly faster
    _trial: list = field(default_factory=list)  # this exploration's (tokens, seconds, sequential tokens)

    def __post_init__(self) -> None:
        if self.block_rounds < 1 or self.explore_every < 1 or not 0 < self.weight <= 1 or not self.ways \
                or self.margin < 0:
            raise ValueError("need some ways, block_rounds and explore_every >= 1, weight in (0, 1] and margin >= 0")
        self.presumed = {way: self.presumed.get(way) for way in self.ways}
        faster = [way for way in self.ways if (self.presumed[way] or 0.0) > 1 + self.margin]
        self.way = self.way or max(faster, key=lambda way: self.presumed[way], default=self.ways[0])
        self._kept = self._kept or self.way
        self._explore_gap = self._explore_gap or self.explore_every
        self.rates = {way: self.rates.get(way) for way in self.ways}
        self._before = deque(maxlen=self._explore_length)
        self._predicted = deque(maxlen=self.block_rounds)

    @property
    def looks_ahead(self) -> bool:
        return self.way == LOOK_AHEAD

    @property
    def _explore_length(self) -> int:
        return max(2, self.block_rounds // 3)  # its first round is not counted

    @property
    def rounds_left(self) -> int:
        """Rounds until this block ends."""
        length = self.block_rounds if self.way == self._kept else self._explore_length
        return length - self._rounds

    def ratio(self, way: str) -> float | None:
        """The way's measured rate over sequential rounds' (None until both are measured)."""
        mine, sequential = self.rates.get(way), self.rates.get(SEQUENTIAL)
        return None if mine is None or not sequential else mine / sequential

    def record(self, tokens: int, seconds: float, sequential_tokens: float | None = None) -> bool:
        """One round run this block's way emitted `tokens` in `seconds`; `sequential_tokens`: what
        a sequential round would have emitted on the same text (None: unknown). -> whether a
        block ended."""
        if seconds > 0 and not (self._rounds == 0 and self._changed):  # not a change of way's first round
            self._block.append((tokens, seconds))
            if self.way == self._kept:
                self._kept_round(tokens, seconds)
                if sequential_tokens is not None and self.way != SEQUENTIAL:
                    self._predicted.append((tokens, seconds, sequential_tokens))
            elif sequential_tokens is not None:
                self._trial.append((tokens, seconds, sequential_tokens))
        self._rounds += 1
        if self.rounds_left > 0 and not self._losing_trial():
            return False
        self._end_block()
        return True

    def _kept_round(self, tokens: int, seconds: float) -> None:
        """A round of the kept way: the latest before the next exploration, or after the last one."""
        self._before.append((tokens, seconds))
        if self._pending is None:
            return
        way, rate, before, after = self._pending
        after.append((tokens, seconds))
        if len(after) >= self._explore_length:
            kept = _rate(before + after)
            self.pairs.setdefault(way, Pairs()).add(math.log(rate / kept))
            self._pending = None

    def _end_block(self) -> None:
        rate = _rate(self._block)
        if rate is not None:
            before = self.rates[self.way]
            self.rates[self.way] = rate if before is None else self.weight * rate + (1 - self.weight) * before
            if self.way == SEQUENTIAL:
                round_s = sum(s for _, s in self._block) / len(self._block)
                last = self.sequential_round_s
                self.sequential_round_s = round_s if last is None else self.weight * round_s + (1 - self.weight) * last
            if self.way != self._kept:
                self._pending = (self.way, rate, list(self._before), [])
                self._before.clear()
        self._block, self._rounds, self._trial = [], 0, []
        chosen = self._next_way()
        self._changed = chosen != self.way
        self.changes += self._changed
        self.way = chosen

    def _to_measure(self) -> list[str]:
        """Ways never measured and not presumed slower than sequential rounds (by the margin)."""
        return [way for way in self.ways if self.rates[way] is None and way != self._kept
                and (self.presumed[way] is None or self.presumed[way] >= 1 - self.margin or way == SEQUENTIAL)]

    def _faster(self) -> str | None:
        """A way whose pairs say it is clearly faster than the kept one by the margin (the best such)."""
        bar = math.log(1 + self.margin)
        clear = [way for way, p in self.pairs.items() if p.mean - CONFIDENCE * p.error > bar]
        return max(clear, key=lambda way: self.pairs[way].mean, default=None)

    def _ruled_out(self, way: str) -> bool:
        """Whether the way's pairs say it cannot plausibly beat the kept one by the margin."""
        pairs = self.pairs.get(way)
        return pairs is not None and pairs.mean + CONFIDENCE * pairs.error < math.log(1 + self.margin)

    def _undecided(self) -> list[str]:
        """The measured ways that could still plausibly beat the kept one by the margin."""
        return [way for way in self.ways if way != self._kept and self.rates[way] is not None
                and not self._ruled_out(way)]

    def _settled(self) -> bool:
        return not self._undecided()

    def _take_over(self, way: str) -> None:
        """`way` becomes the kept way: the old one's pairs against it are the negated ones."""
        self.pairs = {self._kept: self.pairs.get(way, Pairs()).negated()}
        self._kept, self._explore_gap, self._blocks_since_explore = way, self.explore_every, 0
        self._before.clear()
        self._pending = None
        self._predicted.clear()
        self._behind = 0

    @property
    def predicted_sequential(self) -> float | None:
        """Sequential rounds' rate on the text of the kept way's latest rounds (None: not predicted)."""
        known = self._predicted
        if self.sequential_round_s is None or len(known) < max(2, self.block_rounds // 2):
            return None
        return sum(p for _, _, p in known) / (len(known) * self.sequential_round_s)

    def _lead(self, rounds) -> float:
        """Sequential rounds' predicted rate over the measured one of these (tokens, seconds,
        sequential tokens) rounds (0: no prediction)."""
        measured = _rate([(t, s) for t, s, _ in rounds])
        if not measured or self.sequential_round_s is None:
            return 0.0
        return sum(p for _, _, p in rounds) / (len(rounds) * self.sequential_round_s) / measured

    def _losing_trial(self) -> bool:
        """Whether this exploration is clearly slower than predicted sequential rounds on its text."""
        return len(self._trial) >= EARLY_ROUNDS and self._lead(self._trial) > 1 + 2 * EXIT_MARGIN

    def _predicted_behind(self) -> bool:
        """At a kept block's end: whether sequential rounds' predicted rate has beaten the kept
        way's measured one (same rounds) by EXIT_MARGIN at the end of EXIT_BLOCKS kept blocks in a row."""
        behind = self.predicted_sequential is not None and self._lead(self._predicted) > 1 + EXIT_MARGIN
        self._behind = self._behind + 1 if behind else 0
        self._predicted.clear()
        return self._behind >= EXIT_BLOCKS

    def _next_way(self) -> str:
        if self.way != self._kept:  # an exploration ended: its pair completes in the kept way's next rounds
            return self._kept
        if self._kept != SEQUENTIAL and SEQUENTIAL in self.ways and self._predicted_behind():
            self._take_over(SEQUENTIAL)  # the fast exit: clearly slower than predicted sequential rounds
            return SEQUENTIAL
        faster = self._faster()
        if faster is not None:
            self._take_over(faster)
            return faster
        unmeasured = self._to_measure()
        if unmeasured:
            return unmeasured[0]
        self._blocks_since_explore += 1
        settled = self._settled()
        if self._blocks_since_explore < (self._explore_gap if settled else self.explore_every):
            return self._kept
        if settled and self._explored:
            self._explore_gap = min(2 * self._explore_gap, MOST_BACKOFF * self.explore_every)
        self._blocks_since_explore = 0
        slower = [way for way in self.ways if way != self._kept] if settled else self._undecided()
        self._explored += 1
        return slower[(self._explored - 1) % len(slower)] if slower else self._kept
