"""OverlapChoice: whether a lone request's rounds look ahead follows the measured tokens per
second of blocks run each way; the slower way is measured again now and then; one noisy
block does not flip the choice."""

from __future__ import annotations

import random

import pytest

from specdec.round.overlap_choice import OverlapChoice


def run_blocks(choice: OverlapChoice, blocks: int, rate: dict[bool, float], noise: float = 0.0,
               rng: random.Random | None = None) -> list[bool]:
    """Feed `blocks` blocks of rounds, each emitting 3 tokens at the chosen way's rate (±noise);
    returns the way each block ran."""
    ways = []
    for _ in range(blocks):
        ways.append(choice.looks_ahead)
        for _ in range(choice.block_rounds):
            speed = rate[choice.looks_ahead] * (1 + (rng.uniform(-noise, noise) if rng else 0.0))
            choice.record(3, 3 / speed)
    return ways


def test_both_ways_are_measured_first_then_the_faster_is_kept():
    choice = OverlapChoice(block_rounds=4, explore_every=100)
    ways = run_blocks(choice, 10, {True: 100.0, False: 150.0})
    assert ways[:2] == [True, False]  # looking ahead first, then sequential rounds
    assert ways[2:] == [False] * 8
    assert choice.rates == {True: pytest.approx(100.0), False: pytest.approx(150.0)}


def test_when_looking_ahead_is_faster_it_is_kept():
    choice = OverlapChoice(block_rounds=4, explore_every=100)
    assert run_blocks(choice, 8, {True: 200.0, False: 150.0}) == [True, False] + [True] * 6


def test_the_slower_way_runs_one_block_every_explore_every_blocks():
    choice = OverlapChoice(block_rounds=2, explore_every=3)
    ways = run_blocks(choice, 14, {True: 200.0, False: 100.0})
    explored = [i for i, way in enumerate(ways) if not way]
    assert explored[0] == 1  # the first measurement
    assert len(explored) >= 3 and all(b - a == 4 for a, b in zip(explored[1:], explored[2:]))


def test_the_choice_follows_the_host_when_the_faster_way_changes():
    choice = OverlapChoice(block_rounds=2, explore_every=3, weight=0.5)
    ways = run_blocks(choice, 8, {True: 200.0, False: 100.0})
    assert ways == [True, False, True, True, True, False, True, True]
    ways = run_blocks(choice, 16, {True: 80.0, False: 100.0})  # the host lost its second core
    assert choice.rates[False] > choice.rates[True]
    assert ways[-8:].count(False) >= 6  # sequential rounds, looking ahead only to re-measure


def test_noisy_blocks_do_not_flip_a_clear_choice():
    choice = OverlapChoice(block_rounds=8, explore_every=1000)
    ways = run_blocks(choice, 40, {True: 130.0, False: 100.0}, noise=0.1, rng=random.Random(0))
    assert ways[2:] == [True] * 38
    assert choice.changes == 2  # to measure sequential rounds once, and back


def test_only_whole_blocks_count_and_a_block_without_time_keeps_the_rate():
    choice = OverlapChoice(block_rounds=3)
    choice.record(3, 0.01)
    choice.record(3, 0.01)
    assert choice.rates[True] is None and choice.looks_ahead
    choice.record(0, 0.0)
    assert choice.rates[True] == pytest.approx(6 / 0.02)


@pytest.mark.parametrize("bad", [{"block_rounds": 0}, {"explore_every": 0}, {"weight": 0.0}, {"weight": 1.5}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        OverlapChoice(**bad)
