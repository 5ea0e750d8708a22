"""Statistics use the project's definitions: α = accepted / drafted; mean accepted length includes the bonus."""

import pytest

from specdec.requests.stats import SpecStats


def test_acceptance_rate_and_mean_accepted_length():
    s = SpecStats()
    s.record_round(num_drafted=4, num_accepted=4, gamma=4)  # 5 tokens
    s.record_round(num_drafted=4, num_accepted=1, gamma=4)  # 2 tokens
    assert s.acceptance_rate == pytest.approx(5 / 8)
    assert s.mean_accepted_length == pytest.approx(7 / 2)
    assert s.accepted_per_position == [2, 1, 1, 1]
    assert s.acceptance_by_position() == [1.0, 0.5, 0.5, 0.5]


def test_plain_decoding_has_mean_accepted_length_one():
    s = SpecStats()
    for _ in range(3):
        s.record_round(0, 0, gamma=0)
    assert (s.acceptance_rate, s.mean_accepted_length) == (0.0, 1.0)


def test_merge_adds_counters_and_positions():
    a, b = SpecStats(), SpecStats()
    a.record_round(2, 1, 2)
    b.record_round(3, 3, 3)
    a.merge(b)
    assert (a.rounds, a.drafted, a.accepted, a.accepted_per_position) == (2, 5, 4, [2, 1, 1])


def test_impossible_counts_are_rejected():
    with pytest.raises(ValueError):
        SpecStats().record_round(2, 3, 2)
