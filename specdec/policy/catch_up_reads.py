"""What the draft reads beyond the catch-up a plan charged its rows: a drafting plan's recurring reads.

The plan charges a row that drafts its catch-up (the history the draft has not read) spread
over the rounds the row has left (`speculation_policy.amortised_catch_up`): the draft reads a
row's history once, and a row that then drafts to its end pays it once. Rounds under a
drafting plan pay more than that, and pay it again and again: every newcomer's prompt (each
request's, once, in the round its row first drafts), and where plain rounds interleave with
drafting ones (the round-time bound keeps the rounds that read a prompt plain) the tokens
every row decoded plainly since. Spread over a row's remaining rounds but charged only in
the round it is read, a newcomer's prompt was priced at a few per cent of what the draft read
(docs/goodput.md): the plan rated drafting at a full batch by its decoding rounds without
those reads, its predicted TPOT far within a target that its rows, as served, came near.

So the policy keeps, over its recent drafting plans, what the drafting rows' histories held
unread (`RowState.catch_up_tokens`, all of which the draft reads that round) against what
the plan charged them, and every row that drafts is charged the difference per drafting row
as well (`extra`). A per-row mean, not a per-row price: which rows draft is still decided by
their own catch-up, and what drafting as such costs a round is what drafting rounds read.
Where a plan drafts round after round, the reads left are the newcomers' prompts; where it
alternates with plain rounds, the rows' plainly decoded tokens too: a plan that alternates
pays for it. While nothing drafts the last measured figure stands (as `remembered` keeps the
draft's cost).
"""

from __future__ import annotations

from collections.abc import Sequence

READS_MEMORY = 64  # drafting plans the mean is kept over (older ones fade by 1 / READS_MEMORY each plan)
# drafting rows seen before the mean is charged: over a few rows it is one newcomer's prompt or none
MIN_ROWS = 32


class CatchUpReads:
    """Unread history tokens of drafting rows against their charged catch-up, decayed sums."""

    def __init__(self) -> None:
        # (tokens the drafting rows' histories held unread, the tokens the plans charged them
        # before `extra`, drafting rows): one tuple, replaced whole, so that the load monitor's
        # thread reading `extra` never sees one sum updated and not the others
        self.sums = (0.0, 0.0, 0.0)

    def record(self, gammas: Sequence[int], unread: Sequence[float], charged: Sequence[float]) -> None:
        """One priced plan: each row's γ, the history tokens its draft has not read, and the
        catch-up the plan charged it (as amortised, `extra` not included); rows at γ 0 read
        nothing. A plan without drafting rows changes nothing."""
        drafting = [i for i, g in enumerate(gammas) if g > 0]
        if not drafting:
            return
        keep = 1.0 - 1.0 / READS_MEMORY
        was_unread, was_charged, was_rows = self.sums
        self.sums = (keep * was_unread + sum(unread[i] for i in drafting),
                     keep * was_charged + sum(charged[i] for i in drafting), keep * was_rows + len(drafting))

    def extra(self) -> float:
        """Tokens a drafting row's draft reads per round beyond its charged catch-up, on average
        over the recent drafting plans (0 before MIN_ROWS drafting rows were seen)."""
        unread, charged, rows = self.sums
        return max(0.0, unread - charged) / rows if rows >= MIN_ROWS else 0.0
