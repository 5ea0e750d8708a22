"""hop_split: each call's transport split at the router's threads, matched to the call by time."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import hop_split as hs


def test_each_call_takes_the_instants_inside_its_own_span():
    # two calls (enter, sent, back) and their worker spans (handler, thread, done, device s, late s, reply)
    router = [(0.0, 1.0, 3.0), None, (10.0, 11.0, 13.0)]
    worker = [(1.5, 1.6, 2.0, 0.3, 0.0, 2.2), (11.3, 11.4, 12.0, 0.5, 0.0, 12.1)]
    hs.taken["draft"][:] = [0.5, 1.1, 11.2]  # 0.5: a call before these (not theirs)
    hs.answered["draft"][:] = [2.6, 12.5, 12.7]  # the later of two answers inside a span counts
    spans = hs.split("draft", router, worker)
    assert spans["send_hop"] == pytest.approx(1000 * 0.15)  # medians of 0.1 and 0.2 s
    assert spans["wire_in"] == pytest.approx(1000 * 0.25)  # 0.4 and 0.1
    assert spans["wire_out"] == pytest.approx(1000 * 0.5)  # 0.4 and 0.6
    assert spans["to_round"] == pytest.approx(1000 * 0.35)  # 0.4 and 0.3
    assert hs.taken["draft"] == [] and hs.answered["draft"] == []


def test_a_call_without_its_instants_is_left_out():
    hs.taken["target"][:] = []
    hs.answered["target"][:] = [2.0]
    spans = hs.split("target", [(0.0, 1.0, 3.0)], [(1.5, 1.6, 1.8, 0.1, 0.0, 1.9)])
    assert all(v != v for v in spans.values())  # NaN: nothing matched
