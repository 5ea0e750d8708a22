"""How far a look-ahead drafts follows whether it ends within the verify it runs next to."""

from __future__ import annotations

import pytest

from specdec.round.look_ahead_depth import LookAheadDepth


def run(depth: LookAheadDepth, looks: int, step_s: float, verify_s: float, gamma: int = 4) -> list[int]:
    """`looks` look-aheads whose forwards take step_s each, next to verifies of verify_s;
    returns the drafts of each."""
    drafts = []
    for _ in range(looks):
        d = depth.depth(gamma)
        ahead_s = (d + 1) * step_s
        depth.record(d, ahead_s, max(0.0, verify_s - ahead_s))
        drafts.append(d)
    return drafts


def test_a_look_ahead_that_outlasts_the_verify_gets_shorter_until_it_fits():
    depth = LookAheadDepth(settle=4, weight=1.0)
    drafts = run(depth, 40, step_s=2.0, verify_s=9.0)  # 5 forwards take 10 > 9; 4 take 8, slack 1
    assert drafts[:4] == [4] * 4 and drafts[-1] == 3, drafts
    assert set(drafts[8:]) == {3}, "it settles where it fits with some slack"


def test_a_look_ahead_with_room_next_to_the_verify_drafts_the_whole_gamma():
    depth = LookAheadDepth(settle=2, weight=1.0, cut=3)
    drafts = run(depth, 20, step_s=1.0, verify_s=20.0)
    assert drafts[0] == 1 and drafts[-1] == 4 and depth.cut == 0


def test_at_least_one_draft_is_made_however_slow_the_draft():
    depth = LookAheadDepth(settle=1, weight=1.0)
    assert run(depth, 20, step_s=5.0, verify_s=1.0)[-1] == 1
    assert depth.cut <= depth.most_cut


def test_a_pinned_depth_drafts_gamma():
    depth = LookAheadDepth(settle=1, most_cut=0)
    assert run(depth, 10, step_s=5.0, verify_s=1.0) == [4] * 10


@pytest.mark.parametrize("bad", [dict(settle=0), dict(weight=0.0), dict(most_cut=-1)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        LookAheadDepth(**bad)
