"""Acceptance curves: P(first k accepted) for the cluster and for each row."""

import numpy as np
import pytest

from specdec.policy.prefix_acceptance import (expected_accepted, expected_tokens, extend_prefix_acceptance,
                                              row_prefix_acceptance)


@pytest.mark.parametrize(
    "alpha, gamma, tokens",
    [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.5, 2, 1.75), (0.8, 4, (1 - 0.8**5) / 0.2)],
)
def test_expected_tokens_per_round(alpha, gamma, tokens):
    assert expected_tokens(alpha, gamma) == pytest.approx(tokens)



def test_measured_prefix_acceptance_continues_with_its_last_conditional_rate():
    probs = extend_prefix_acceptance((0.6, 0.5), 4)
    r = 0.5 / 0.6
    assert probs == pytest.approx([0.6, 0.5, 0.5 * r, 0.5 * r * r])
    assert extend_prefix_acceptance((0.7, 0.5, 0.4), 2) == pytest.approx([0.7, 0.5])


def test_a_row_without_history_follows_the_cluster():
    cluster = np.array([0.8, 0.6, 0.45])
    assert row_prefix_acceptance(cluster, 0.6, drafted=0, accepted=0, prior_tokens=16) == pytest.approx(cluster)


def test_a_row_with_its_own_history_moves_away_from_the_cluster_as_it_drafts_more():
    cluster = np.array([0.5, 0.25, 0.125])
    few = row_prefix_acceptance(cluster, 0.5, drafted=4, accepted=4, prior_tokens=16)
    many = row_prefix_acceptance(cluster, 0.5, drafted=400, accepted=396, prior_tokens=16)
    assert cluster[0] < few[0] < many[0] <= 1.0
    assert (np.diff(many) <= 0).all() and many[-1] > 0.9
    poor = row_prefix_acceptance(cluster, 0.5, drafted=200, accepted=2, prior_tokens=16)
    assert poor[0] < 0.1


def test_a_row_drafting_longer_than_the_cluster_with_the_clusters_acceptance_follows_the_cluster():
    """The drafts after a round's first rejection are never judged. A row that drafted 8 a
    round for 100 rounds and had what the cluster's curve expects accepted keeps the cluster's
    curve. Counted as accepted / drafted against the cluster's α (measured where rows drafted
    4), it looked 25 % worse per position and planned as a poor row."""
    cluster = 0.8 ** np.arange(1, 9)
    cluster_alpha = float(cluster[:4].sum() / 4)  # accepted / drafted of rows drafting 4
    offered = (100,) * 8
    expected = expected_accepted(cluster, offered)
    assert expected == pytest.approx(100 * cluster.sum())
    accepted = round(expected)
    row = row_prefix_acceptance(cluster, cluster_alpha, 800, accepted, 16, expected)
    assert row == pytest.approx(cluster, rel=0.01)
    counted_alike = row_prefix_acceptance(cluster, cluster_alpha, 800, accepted, 16)
    assert counted_alike[3] < 0.4 * cluster[3]
    assert expected_accepted(cluster, ()) == 0.0
    assert expected_accepted(cluster[:2], (1, 1, 1)) == pytest.approx(0.8 + 0.64 + 0.64 * 0.8)  # continued
