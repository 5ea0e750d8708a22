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

* a way never measured is measured first (in the order given: the likeliest first);
* then the fastest is kept, and every `explore_every` blocks one of the others (in turn)
  runs a block again, so the choice follows the host and the requests as they change;
* a block of a way other than the kept one (at first: the first one) lasts a third of
  `block_rounds`: measuring a slower way costs the rounds it runs;
* each way's rate is an exponentially weighted mean over its blocks (`weight` for the
  newest), so one noisy block does not flip the choice.

`DraftAhead` keeps one choice per kind of step (how many rows, greedy or sampled). Which
way a round runs never changes what is emitted (every way is exact), only how fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES = "sequential", "look-ahead", "micro-batches"


@dataclass
class OverlapChoice:
    """ways: the ways to choose from, the one to try first first; block_rounds: rounds per
    block; explore_every: every this many blocks a slower way runs one block again;
    weight: share of the newest block in a way's rate."""

    ways: tuple[str, ...] = (LOOK_AHEAD, SEQUENTIAL)
    block_rounds: int = 24
    explore_every: int = 6
    weight: float = 0.5
    way: str = ""  # this block's way (the first of `ways` until measured)
    rates: dict[str, float | None] = field(default_factory=dict)  # way -> emitted tokens/s
    changes: int = 0  # times the chosen way changed
    _tokens: int = 0
    _seconds: float = 0.0
    _rounds: int = 0
    _blocks_since_explore: int = 0
    _explored: int = 0  # explorations so far (which slower way is next)
    _kept: str = ""  # the way believed fastest (the first way until measured)

    def __post_init__(self) -> None:
        if self.block_rounds < 1 or self.explore_every < 1 or not 0 < self.weight <= 1 or not self.ways:
            raise ValueError("need some ways, block_rounds and explore_every >= 1 and weight in (0, 1]")
        self.way = self.way or self.ways[0]
        self._kept = self._kept or self.way
        self.rates = {way: self.rates.get(way) for way in self.ways}

    @property
    def looks_ahead(self) -> bool:
        return self.way == LOOK_AHEAD

    @property
    def rounds_left(self) -> int:
        """Rounds until this block ends."""
        length = self.block_rounds if self.way == self._kept else max(1, self.block_rounds // 3)
        return length - self._rounds

    def record(self, tokens: int, seconds: float) -> None:
        """One round run this block's way emitted `tokens` in `seconds`."""
        self._tokens += tokens
        self._seconds += max(0.0, seconds)
        self._rounds += 1
        if self.rounds_left <= 0:
            self._end_block()

    def _end_block(self) -> None:
        if self._seconds > 0:
            rate = self._tokens / self._seconds
            before = self.rates[self.way]
            self.rates[self.way] = rate if before is None else self.weight * rate + (1 - self.weight) * before
        self._tokens, self._seconds, self._rounds = 0, 0.0, 0
        chosen = self._next_way()
        self.changes += chosen != self.way
        self.way = chosen

    def _next_way(self) -> str:
        unmeasured = [way for way in self.ways if self.rates[way] is None]
        if unmeasured:
            return unmeasured[0]
        best = self._kept = max(self.ways, key=lambda way: self.rates[way])
        if self.way != best:  # that was an exploration block (or the best way changed)
            self._blocks_since_explore = 0
            return best
        self._blocks_since_explore += 1
        if self._blocks_since_explore < self.explore_every:
            return best
        self._blocks_since_explore = 0
        slower = [way for way in self.ways if way != best]
        self._explored += 1
        return slower[(self._explored - 1) % len(slower)] if slower else best
