"""A plan made ahead: the goodput plan for a round's rows, made while the round before it
verified (`specdec.round.round_planner.RoundPlanner`), taken by the round it was made for.

The round's rows are those the plan saw, less the rows that finished, plus rows that joined
since (marked NEWCOMER). Taking it costs the round no planning: each row's γ is the plan's
within the row's cap (its request's own where it fixes one), and a newcomer drafts what
the plan gave most of the rows it chose for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdec.policy.row_state import RowState
    from specdec.policy.speculation_policy import Decision

NEWCOMER = -1  # a plan made ahead marks a row it did not plan (one that joined since) with this γ


def taken_ahead(ahead: Decision, rows: list[RowState], fixed: list[int | None], lo: list[int],
                hi: list[int]) -> tuple[list[int], tuple[float, ...]]:
    """Each row's γ and amortised catch-up from a plan made ahead: its own request's γ where
    it fixes one, else the plan's within its cap. A row the plan did not see (γ NEWCOMER)
    drafts what the plan gave most of the rows it chose for (the smaller γ at a tie): a
    fresh row has the cluster's acceptance, and in a batch of rows alike the plan is one
    γ for all; its catch-up is spread over the rounds it has left at γ + 1 tokens a round (and
    the plan's extra read added, as for every row it planned)."""
    chosen = [g for g, f in zip(ahead.gammas, fixed) if f is None and g != NEWCOMER]
    common = max(sorted(set(chosen)), key=chosen.count, default=0)
    gammas, catch_up = [], []
    for g, f, own, top, row, c in zip(ahead.gammas, fixed, lo, hi, rows, ahead.catch_up):
        if g == NEWCOMER:
            g = common
            c = row.catch_up_tokens / max(1.0, row.remaining_tokens / (1 + min(g, top))) + ahead.extra_read
        gammas.append(own if f is not None else min(g, top))
        catch_up.append(c)
    return gammas, tuple(catch_up)
