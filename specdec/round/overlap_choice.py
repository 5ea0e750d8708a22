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
* then the fastest is kept; another way takes over only when its rate beats the kept one's
  by more than `margin` (one noisy block does not flip the choice);
* every `explore_every` blocks one of the others (in turn) runs a block again, so the choice
  follows the host and the requests as they change; each time such a block confirms the
  kept way, the wait until the next one doubles (at most `MOST_BACKOFF` times
  `explore_every`), and it starts over when the kept way changes;
* a block of a way other than the kept one (at first: the first one) lasts a third of
  `block_rounds`;
* each way's rate is an exponentially weighted mean over its blocks (`weight` for the newest).

`DraftAhead` keeps one choice per kind of step (how many rows, greedy or sampled) and shares
the measured ratios between the kinds of several rows. Which way a round runs never changes
what is emitted (every way is exact), only how fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES = "sequential", "look-ahead", "micro-batches"
MOST_BACKOFF = 8  # the longest wait between two explorations, in units of explore_every


@dataclass
class OverlapChoice:
    """ways: the ways to choose from, the one to try first first; block_rounds: rounds per
    block; explore_every: every this many blocks a slower way runs one block again;
    weight: share of the newest block in a way's rate; presumed: way -> its rate over
    sequential rounds as measured for other kinds of step (None: unknown); margin: how much
    faster a way must be (measured, or presumed) to take over or to be tried first."""

    ways: tuple[str, ...] = (LOOK_AHEAD, SEQUENTIAL)
    block_rounds: int = 24
    explore_every: int = 6
    weight: float = 0.5
    presumed: dict[str, float | None] = field(default_factory=dict)
    margin: float = 0.03
    way: str = ""  # this block's way (the first to try until measured)
    rates: dict[str, float | None] = field(default_factory=dict)  # way -> emitted tokens/s
    changes: int = 0  # times the chosen way changed
    _tokens: int = 0
    _seconds: float = 0.0
    _rounds: int = 0
    _blocks_since_explore: int = 0
    _explore_gap: int = 0  # blocks between two explorations now (explore_every, doubling)
    _explored: int = 0  # explorations so far (which slower way is next)
    _exploring: bool = False  # this block re-measures a slower way
    _kept: str = ""  # the way believed fastest (the first to try until measured)

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

    @property
    def looks_ahead(self) -> bool:
        return self.way == LOOK_AHEAD

    @property
    def rounds_left(self) -> int:
        """Rounds until this block ends."""
        length = self.block_rounds if self.way == self._kept else max(1, self.block_rounds // 3)
        return length - self._rounds

    def ratio(self, way: str) -> float | None:
        """The way's measured rate over sequential rounds' (None until both are measured)."""
        mine, sequential = self.rates.get(way), self.rates.get(SEQUENTIAL)
        return None if mine is None or not sequential else mine / sequential

    def record(self, tokens: int, seconds: float) -> bool:
        """One round run this block's way emitted `tokens` in `seconds`. -> whether a block ended."""
        self._tokens += tokens
        self._seconds += max(0.0, seconds)
        self._rounds += 1
        if self.rounds_left > 0:
            return False
        self._end_block()
        return True

    def _end_block(self) -> None:
        if self._seconds > 0:
            rate = self._tokens / self._seconds
            before = self.rates[self.way]
            self.rates[self.way] = rate if before is None else self.weight * rate + (1 - self.weight) * before
        self._tokens, self._seconds, self._rounds = 0, 0.0, 0
        chosen = self._next_way()
        self.changes += chosen != self.way
        self.way = chosen

    def _to_measure(self) -> list[str]:
        """Ways never measured and not presumed slower than sequential rounds (by the margin)."""
        return [way for way in self.ways if self.rates[way] is None
                and (self.presumed[way] is None or self.presumed[way] >= 1 - self.margin or way == SEQUENTIAL)]

    def _best(self) -> str:
        """The kept way, unless a measured one beats it by more than the margin."""
        measured = [way for way in self.ways if self.rates[way] is not None]
        fastest = max(measured, key=lambda way: self.rates[way])
        kept = self.rates.get(self._kept)
        if kept is not None and self.rates[fastest] <= kept * (1 + self.margin):
            return self._kept
        return fastest

    def _next_way(self) -> str:
        unmeasured = self._to_measure()
        if unmeasured:
            return unmeasured[0]
        explored, self._exploring = self._exploring, False
        best = self._best()
        if best != self._kept:  # another way took over: explore at the first pace again
            self._kept, self._explore_gap, self._blocks_since_explore = best, self.explore_every, 0
            return best
        if self.way != best:  # a block of another way (first measured, or explored) confirmed the kept way
            self._blocks_since_explore = 0
            if explored:
                self._explore_gap = min(2 * self._explore_gap, MOST_BACKOFF * self.explore_every)
            return best
        self._blocks_since_explore += 1
        if self._blocks_since_explore < self._explore_gap:
            return best
        self._blocks_since_explore = 0
        slower = [way for way in self.ways if way != best]
        self._explored += 1
        self._exploring = bool(slower)
        return slower[(self._explored - 1) % len(slower)] if slower else best
