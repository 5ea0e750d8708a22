"""Whether a row's look-ahead is worth drafting: measured by how often look-aheads hit.

A look-ahead (`specdec.round.draft_ahead`) drafts the next round for a few verdicts of the round
being verified; it is used only when the verdict matches one of them (a *hit*). A miss costs
twice: the draft's batched look-ahead work ran next to the verify for nothing, and the round
still has to wait for it before it can ask for a fresh proposal. How often look-aheads hit
depends on how the target picks its last token: a greedy target's argmax is often the
draft's own guess, a sampled target's token much less often (a branch after a rejection
guesses the recovered token as the draft's next-best one), and below some rate the
look-ahead makes rounds slower than sequential ones (docs/rounds.md).

So hits are counted apart for greedy and for sampled rows, as an exponentially weighted
rate over their recent look-aheads (`weight` for the newest). A kind whose rate falls below
`min_hit_rate` stops looking ahead, except every `probe_every`-th row of that kind, so that
its rate stays measured and looking ahead comes back when it would hit again. A probe is
dear: its look-ahead is draft work next to the verify that will probably be thrown away,
and its round is longer than a sequential one, so frequent probes show in the ITL tail;
rare ones keep the rate current at a cost no request notices. At a weight of 1/32 a kind
whose hits return still crosses the bar after about 9 probes (a few hundred rows). Until a kind
has `warmup` look-aheads it looks ahead. Whether a row looks ahead never changes what is
emitted, only when its drafts are made.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LookAheadHits:
    """min_hit_rate: a kind looks ahead while its hit rate is at least this (0 = always);
    weight: share of the newest look-ahead in the rate; warmup: look-aheads before the rate
    is trusted; probe_every: below the bar, every this many rows of the kind look ahead."""

    min_hit_rate: float = 0.3
    weight: float = 1 / 32
    warmup: int = 16
    probe_every: int = 32
    rates: dict[bool, float] = field(default_factory=dict)  # greedy? -> hit rate
    looks: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # greedy? -> look-aheads seen
    _skipped: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})

    def __post_init__(self) -> None:
        if not 0 <= self.min_hit_rate <= 1 or not 0 < self.weight <= 1 or self.warmup < 0 or self.probe_every < 1:
            raise ValueError("need min_hit_rate in [0, 1], weight in (0, 1], warmup >= 0 and probe_every >= 1")

    def record(self, greedy: bool, hit: bool) -> None:
        """One look-ahead of a row of this kind hit (its branch became the next drafts) or missed."""
        before = self.rates.get(greedy)
        self.rates[greedy] = float(hit) if before is None else self.weight * hit + (1 - self.weight) * before
        self.looks[greedy] += 1

    def trusted_rate(self, greedy: bool) -> float | None:
        """The kind's hit rate once `warmup` look-aheads were seen; None before."""
        return self.rates.get(greedy) if self.looks[greedy] >= max(1, self.warmup) else None

    def allows(self, greedy: bool) -> bool:
        """Whether the next row of this kind looks ahead (call once per row and step)."""
        rate = self.trusted_rate(greedy)
        if rate is None or rate >= self.min_hit_rate:
            self._skipped[greedy] = 0
            return True
        self._skipped[greedy] += 1
        if self._skipped[greedy] >= self.probe_every:  # a probe keeps the rate measured
            self._skipped[greedy] = 0
            return True
        return False
