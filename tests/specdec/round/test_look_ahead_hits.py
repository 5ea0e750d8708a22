"""How many branches a look-ahead drafts follows how often each branch position hits."""

from __future__ import annotations

import pytest

from specdec.round.look_ahead_hits import LookAheadHits


def feed(hits: LookAheadHits, looks: int, hit_at: list[int | None]) -> None:
    """`looks` look-aheads of `hits.most` branches, hitting at hit_at[i % len(hit_at)]."""
    for i in range(looks):
        hits.record(hits.most, hit_at[i % len(hit_at)])


def test_every_branch_is_drafted_until_its_rate_is_measured():
    hits = LookAheadHits(most=6, warmup=16)
    feed(hits, 15, [0])
    assert hits.branches() == 6, "15 look-aheads are not enough to judge the other branches"
    feed(hits, 1, [0])
    assert hits.branches() == 1


def test_branches_up_to_the_last_one_that_hits_often_enough_are_drafted():
    hits = LookAheadHits(most=6, min_share=0.05, warmup=4, probe_every=1000)
    feed(hits, 200, [0, 0, 2, None, 0, 2, None, None, 0, 0])  # positions 0 and 2 hit, 1 and 3-5 never
    assert hits.branches() == 3, "position 1 never hits but lies before position 2, which does"
    assert hits.rates[2] == pytest.approx(0.2, abs=0.05) and hits.rates[1] == pytest.approx(0.0, abs=1e-6)


def test_a_probe_drafts_every_branch_so_a_branch_that_hits_again_comes_back():
    hits = LookAheadHits(most=4, min_share=0.05, weight=0.25, warmup=2, probe_every=5)
    feed(hits, 40, [0, None])
    counts = [hits.branches() for _ in range(10)]
    assert counts.count(4) == 2 and counts.count(1) == 8, counts
    for _ in range(3):  # the probes see position 3 hit
        hits.record(4, 3)
    assert hits.branches() == 4


def test_a_look_ahead_with_fewer_branches_counts_only_those():
    hits = LookAheadHits(most=4, warmup=1)
    hits.record(2, None)
    assert hits.seen == {0: 1, 1: 1} and hits.rates == {0: 0.0, 1: 0.0}


def test_the_rate_weights_recent_look_aheads():
    hits = LookAheadHits(weight=0.5, warmup=1)
    for hit in (0, 0, None):
        hits.record(1, hit)
    assert hits.rates[0] == pytest.approx(0.5)  # 1 -> 1 -> 0.5


@pytest.mark.parametrize("settings", [dict(min_share=1.5), dict(weight=0), dict(probe_every=0), dict(warmup=-1),
                                      dict(most=0)])
def test_bad_settings_are_refused(settings):
    with pytest.raises(ValueError):
        LookAheadHits(**settings)
