"""How many branches a look-ahead drafts: measured by which of them hit.

A look-ahead (`specdec.round.draft_ahead`) drafts the next round for a few verdicts of the
round being verified, each a *branch*, in the proposer's order (`Proposer.look_ahead`: every
draft accepted first, then a rejection at the 1st, 2nd, ... draft, ...); it is used only
when the verdict matches one of them (a *hit*). Each branch is one more row in the draft's
batched look-ahead and holds a free draft cache slot while it runs, so a branch that never
hits is draft work for nothing. How often each branch hits depends on the draft (how often
it ranks the target's token second where it is wrong) and on the sampling: a greedy
target's token is often the draft's next-best one; a draft that guesses elsewhere when
wrong makes every branch after a rejection miss.

So each branch position's hit rate is measured: the share of look-aheads that hit through
it, an exponentially weighted mean over the look-aheads that drafted it (`weight` for the
newest). A look-ahead drafts the branches up to the last one that hits at least `min_share`
of the time (or is not measured yet: `warmup` look-aheads); every `probe_every`-th look-ahead
drafts all `most` of them, so the rates of branches left out stay measured and a branch
comes back when it would hit again. Which branches are drafted never changes what is
emitted, only how many rounds have their drafts ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LookAheadHits:
    """most: branches drafted while measuring; min_share: a branch position is drafted while
    at least this share of look-aheads hit through it; weight: share of the newest look-ahead
    in a rate; warmup: look-aheads before a position's rate is trusted; probe_every: every
    this many look-ahead steps draft all `most` branches."""

    most: int = 12
    min_share: float = 0.02
    weight: float = 1 / 32
    warmup: int = 16
    probe_every: int = 16
    rates: dict[int, float] = field(default_factory=dict)  # branch position -> share of look-aheads hitting there
    seen: dict[int, int] = field(default_factory=dict)  # branch position -> look-aheads that drafted it
    _steps: int = 0

    def __post_init__(self) -> None:
        if self.most < 1 or not 0 <= self.min_share <= 1 or not 0 < self.weight <= 1 or self.warmup < 0 \
                or self.probe_every < 1:
            raise ValueError("need most >= 1, min_share in [0, 1], weight in (0, 1], warmup >= 0, probe_every >= 1")

    def record(self, drafted: int, hit: int | None) -> None:
        """One row's look-ahead drafted `drafted` branches; branch `hit` (position) was used, or none."""
        for position in range(min(drafted, self.most)):
            before = self.rates.get(position)
            now = float(position == hit)
            self.rates[position] = now if before is None else self.weight * now + (1 - self.weight) * before
            self.seen[position] = self.seen.get(position, 0) + 1

    def worth(self, position: int) -> bool:
        """Whether branch `position` is drafted: not measured yet, or it hits often enough."""
        return self.seen.get(position, 0) < self.warmup or self.rates.get(position, 0.0) >= self.min_share

    def branches(self) -> int:
        """Branches per row for the next look-ahead step (call once per step)."""
        self._steps += 1
        if self._steps % self.probe_every == 0:
            return self.most
        return 1 + max((p for p in range(self.most) if self.worth(p)), default=0)
