"""SequentialEstimate: what a sequential round of γ drafts would have emitted for the rows of a
look-ahead step, from each row's own verdict and the draft's measured acceptance."""

from __future__ import annotations

import pytest

from specdec.round.sequential_estimate import MIN_TESTED, SequentialEstimate


def test_nothing_is_predicted_before_enough_drafts_were_judged():
    estimate = SequentialEstimate()
    assert estimate.tokens([(4, 3, 1)]) is None
    estimate.observe([(4, 4, 2)] * MIN_TESTED)  # 2 accepted and 1 rejected per row
    assert estimate.alpha == pytest.approx(2 / 3)


def test_a_rejection_is_where_a_sequential_round_stops_too_and_accepted_drafts_go_on():
    estimate = SequentialEstimate()
    estimate.accepted, estimate.tested = 50.0, 100.0  # α 0.5
    assert estimate.tokens([(4, 3, 1)]) == 2, "rejected at the 2nd of the same drafts"
    assert estimate.tokens([(4, 3, 3)]) == pytest.approx(3 + 1 + 0.5), "the 4th draft accepted half the time"
    assert estimate.tokens([(4, 0, 0)]) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625), "a plain round: L(γ)"
    assert estimate.tokens([(0, 0, 0), (4, 4, 4)]) == pytest.approx(1 + 5), "no speculation: one token"
