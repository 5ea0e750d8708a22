"""Whether a lone request's rounds look ahead: chosen from measurements, not assumed.

Drafting ahead (`specdec.round.draft_ahead`) pays only where the draft's look-ahead really runs
next to the verify: with a free core or device for each. On a CPU host that gives the
workers less than two cores, the look-ahead and the verify slow each other down, and
sequential rounds are faster (serving benchmark). So steps that could look ahead run in
*blocks* of rounds, each block either looking ahead or not, and the choice follows the
measured emitted tokens per second of each way:

* a way that has never been measured is measured first;
* then the faster one is kept, and the other is measured again every `explore_every`
  blocks, so that the choice follows the host (and the requests) as they change;
* each way's rate is an exponentially weighted mean over its blocks (`weight` for the
  newest), so one noisy block does not flip the choice.

Only steps that could look ahead are counted; a block is counted in rounds. Which way a
round runs never changes what is emitted (both are exact), only how fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OverlapChoice:
    """block_rounds: rounds per block; explore_every: every this many blocks the slower way
    runs one block again; weight: share of the newest block in a way's rate."""

    block_rounds: int = 24
    explore_every: int = 6
    weight: float = 0.5
    looks_ahead: bool = True  # this block's way
    rates: dict[bool, float | None] = field(default_factory=lambda: {True: None, False: None})  # tokens/s
    changes: int = 0  # times the chosen way changed
    _tokens: int = 0
    _seconds: float = 0.0
    _rounds: int = 0
    _blocks_since_explore: int = 0

    def __post_init__(self) -> None:
        if self.block_rounds < 1 or self.explore_every < 1 or not 0 < self.weight <= 1:
            raise ValueError("block_rounds and explore_every must be >= 1 and weight in (0, 1]")

    def record(self, tokens: int, seconds: float) -> None:
        """One round that could look ahead (run this block's way) emitted `tokens` in `seconds`."""
        self._tokens += tokens
        self._seconds += max(0.0, seconds)
        self._rounds += 1
        if self._rounds >= self.block_rounds:
            self._end_block()

    def _end_block(self) -> None:
        if self._seconds > 0:
            rate = self._tokens / self._seconds
            before = self.rates[self.looks_ahead]
            self.rates[self.looks_ahead] = rate if before is None else self.weight * rate + (1 - self.weight) * before
        self._tokens, self._seconds, self._rounds = 0, 0.0, 0
        chosen = self._next_way()
        self.changes += chosen != self.looks_ahead
        self.looks_ahead = chosen

    def _next_way(self) -> bool:
        unmeasured = [way for way in (True, False) if self.rates[way] is None]
        if unmeasured:
            return unmeasured[0]
        better = self.rates[True] >= self.rates[False]
        if self.looks_ahead != better:  # that was an exploration block (or the better way changed)
            self._blocks_since_explore = 0
            return better
        self._blocks_since_explore += 1
        if self._blocks_since_explore >= self.explore_every:
            self._blocks_since_explore = 0
            return not better
        return better
