"""Which rows look ahead follows how often their kind's look-aheads hit (greedy and sampled apart)."""

from __future__ import annotations

import pytest

from specdec.round.look_ahead_hits import LookAheadHits


def allowed(hits: LookAheadHits, greedy: bool, rows: int) -> int:
    return sum(hits.allows(greedy) for _ in range(rows))


def test_a_kind_looks_ahead_until_its_rate_is_measured():
    hits = LookAheadHits(min_hit_rate=0.3, warmup=16)
    for _ in range(15):
        hits.record(greedy=False, hit=False)
    assert hits.trusted_rate(False) is None
    assert allowed(hits, False, 10) == 10, "15 misses are not enough to judge"
    hits.record(greedy=False, hit=False)
    assert hits.trusted_rate(False) == 0.0


def test_a_kind_that_rarely_hits_looks_ahead_only_in_probes_and_the_other_kind_is_unaffected():
    hits = LookAheadHits(min_hit_rate=0.3, warmup=4, probe_every=8)
    for _ in range(40):
        hits.record(greedy=False, hit=False)
        hits.record(greedy=True, hit=True)
    assert allowed(hits, False, 80) == 10, "one row in 8 probes"
    assert allowed(hits, True, 80) == 80


def test_a_kind_that_hits_again_looks_ahead_again():
    hits = LookAheadHits(min_hit_rate=0.3, weight=0.25, warmup=4)
    for _ in range(20):
        hits.record(greedy=False, hit=False)
    assert not hits.allows(False)
    for _ in range(3):  # the probes hit
        hits.record(greedy=False, hit=True)
    assert hits.trusted_rate(False) > 0.3 and allowed(hits, False, 5) == 5


def test_the_rate_weights_recent_look_aheads():
    hits = LookAheadHits(weight=0.5, warmup=1)
    for hit in (True, True, False):
        hits.record(greedy=True, hit=hit)
    assert hits.trusted_rate(True) == pytest.approx(0.5)  # 1 -> 1 -> 0.5


def test_a_zero_bar_always_looks_ahead():
    hits = LookAheadHits(min_hit_rate=0.0, warmup=1)
    for _ in range(50):
        hits.record(greedy=False, hit=False)
    assert allowed(hits, False, 20) == 20


@pytest.mark.parametrize("settings", [dict(min_hit_rate=1.5), dict(weight=0), dict(probe_every=0), dict(warmup=-1)])
def test_bad_settings_are_refused(settings):
    with pytest.raises(ValueError):
        LookAheadHits(**settings)
