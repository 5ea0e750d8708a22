"""How far a look-ahead drafts: as far as fits in the verify it runs next to.

A look-ahead (`specdec.round.draft_ahead`) drafts the next round while the target verifies
this one: one draft forward reads the round's drafts and guesses the bonus token, then one
forward per draft of the next round. A look-ahead that outlasts the verify sits on the
round's critical path: a round whose look-ahead hit waits for it, and a round whose
look-ahead missed waits for it and then for a fresh proposal, which makes it slower than a
sequential round. Where a draft step is dear next to a verify (the emulated accelerator
profiles: a verify costs about five draft steps plus the two calls' framework time), a
look-ahead one draft shorter than γ fits and makes drafting ahead pay; where it is cheap
(a large target), the whole γ fits.

So each look-ahead's time is measured against the verify: the *slack* is how long the round
still waited for the verdict after the look-ahead ended, and a draft step's time is the
look-ahead's time over its forwards (both exponentially weighted, `weight` for the
newest). Every `settle` look-aheads the depth moves by one draft: shorter while the slack
is under a quarter of a step (the look-ahead ends with the verify or after it), longer
while it exceeds one and a half steps (room for one more). The depth is the next round's γ
less `cut`, at least 1. How far a look-ahead drafts never changes what is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LookAheadDepth:
    """settle: look-aheads between two changes of the depth; weight: share of the newest
    look-ahead in the measured slack and step time; most_cut: the most drafts a look-ahead
    drafts fewer than γ."""

    settle: int = 8
    weight: float = 0.25
    most_cut: int = 15
    cut: int = 0  # drafts fewer than the next round's γ
    slack_s: float | None = None  # the round's wait for the verdict after the look-ahead ended
    step_s: float | None = None  # one draft forward of the look-ahead
    _since: int = 0

    def __post_init__(self) -> None:
        if self.settle < 1 or not 0 < self.weight <= 1 or self.most_cut < 0:
            raise ValueError("need settle >= 1, weight in (0, 1] and most_cut >= 0")

    def depth(self, gamma: int) -> int:
        """Drafts a look-ahead makes for a row whose next round's γ is `gamma` (> 0)."""
        return max(1, gamma - self.cut)

    def record(self, drafts: int, ahead_s: float, waited_s: float) -> None:
        """A look-ahead of `drafts` drafts (drafts + 1 forwards) took `ahead_s`; the round
        then waited `waited_s` more for the verdict."""
        self.step_s = self._mean(self.step_s, ahead_s / (drafts + 1))
        self.slack_s = self._mean(self.slack_s, max(0.0, waited_s))
        self._since += 1
        if self._since < self.settle:
            return
        self._since = 0
        if self.slack_s < self.step_s / 4:
            self.cut = min(self.cut + 1, self.most_cut)
        elif self.slack_s > 1.5 * self.step_s:
            self.cut = max(self.cut - 1, 0)

    def _mean(self, before: float | None, now: float) -> float:
        return now if before is None else self.weight * now + (1 - self.weight) * before
