"""What a sequential round would have emitted for the rows of a look-ahead step.

`OverlapChoice` judges a way against the kept one in pairs of blocks, and the pairs are noisy
(a round emits 1 to γ + 1 tokens, so a 15 % gap takes many pairs to be clear). Where the kept
way looks ahead, each of its rounds also says what sequential rounds would have emitted on the
same text, and sequential rounds' time per round hardly depends on the text: their rate is
predicted round by round, with the text's noise shared by both sides (docs/drafting_ahead.md).

A row of a look-ahead step verifies drafts made ahead (d ≤ γ of them), drafts proposed first,
or none (a plain round after a miss). A sequential round from the same history drafts γ: the
draft's continuation of the same history (greedy: the same tokens; sampled: the same
distribution), so a rejection at the (k + 1)-th draft means it too emits k + 1 tokens; where
all d drafts were accepted, its γ − d further drafts are each accepted with the draft's
per-position acceptance α in turn; a row without drafts would emit L(γ) = Σ_{j≤γ} α^j.
α is the rows' own (accepted drafts over drafts tested, older rounds weighing less).
"""

from __future__ import annotations

from collections.abc import Iterable

KEEP = 0.98  # an older round's weight in α relative to the next one
MIN_TESTED = 8  # drafts tested before α is trusted


class SequentialEstimate:
    """The tokens a sequential round would have emitted for a step's rows (None: α unknown)."""

    def __init__(self) -> None:
        self.accepted = 0.0  # drafts accepted, decayed
        self.tested = 0.0  # drafts the target judged (accepted, or the first rejected), decayed

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.tested if self.tested >= MIN_TESTED else None

    def observe(self, rows: Iterable[tuple[int, int, int]]) -> None:
        """A round's rows as (γ, drafted, accepted): the draft's acceptance on this text."""
        accepted = tested = 0
        for _, drafted, row_accepted in rows:
            accepted += row_accepted
            tested += row_accepted + (row_accepted < drafted)
        self.accepted = KEEP * self.accepted + accepted
        self.tested = KEEP * self.tested + tested

    def tokens(self, rows: Iterable[tuple[int, int, int]]) -> float | None:
        """Sum over the rows (γ, drafted, accepted) of what a sequential round of γ drafts would emit."""
        alpha = self.alpha
        if alpha is None:
            return None
        total = 0.0
        for gamma, drafted, accepted in rows:
            if gamma <= 0:
                total += 1
            elif accepted < drafted:
                total += accepted + 1
            else:  # every draft (if any) accepted: the further ones in turn
                total += accepted + sum(alpha ** j for j in range(gamma - accepted + 1))
        return total
