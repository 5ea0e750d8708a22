"""OverlapChoice: which way a kind of step runs (sequential, looking ahead, micro-batches)
follows the measured tokens per second of blocks run each way; slower ways are measured
again now and then, in turn and ever more rarely; one noisy block does not flip the choice;
what other kinds of step measured decides which ways are worth measuring first."""

from __future__ import annotations

import random

import pytest

from specdec.round.overlap_choice import LOOK_AHEAD, MICRO_BATCHES, MOST_BACKOFF, SEQUENTIAL, OverlapChoice

LONE = (LOOK_AHEAD, SEQUENTIAL)
BATCH = (SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES)


def run_blocks(choice: OverlapChoice, blocks: int, rate: dict[str, float], noise: float = 0.0,
               rng: random.Random | None = None) -> list[str]:
    """Feed `blocks` blocks of rounds, each emitting 3 tokens at the chosen way's rate (±noise);
    returns the way each block ran."""
    ways = []
    for _ in range(blocks):
        ways.append(choice.way)
        for _ in range(choice.rounds_left):
            speed = rate[choice.way] * (1 + (rng.uniform(-noise, noise) if rng else 0.0))
            choice.record(3, 3 / speed)
    return ways


def test_every_way_is_measured_first_in_the_order_given_then_the_fastest_is_kept():
    choice = OverlapChoice(LONE, block_rounds=4, explore_every=100)
    ways = run_blocks(choice, 10, {LOOK_AHEAD: 100.0, SEQUENTIAL: 150.0})
    assert ways == [LOOK_AHEAD] + [SEQUENTIAL] * 9
    assert choice.rates == {LOOK_AHEAD: pytest.approx(100.0), SEQUENTIAL: pytest.approx(150.0)}


def test_with_three_ways_the_fastest_of_them_is_kept():
    choice = OverlapChoice(BATCH, block_rounds=4, explore_every=100)
    ways = run_blocks(choice, 8, {SEQUENTIAL: 100.0, LOOK_AHEAD: 90.0, MICRO_BATCHES: 140.0})
    assert ways == [SEQUENTIAL, LOOK_AHEAD] + [MICRO_BATCHES] * 6
    assert not choice.looks_ahead


def test_when_looking_ahead_is_faster_it_is_kept():
    choice = OverlapChoice(LONE, block_rounds=4, explore_every=100)
    assert run_blocks(choice, 8, {LOOK_AHEAD: 200.0, SEQUENTIAL: 150.0}) == [LOOK_AHEAD, SEQUENTIAL] + [LOOK_AHEAD] * 6
    assert choice.looks_ahead


def test_a_slower_way_is_explored_again_ever_more_rarely_while_it_stays_slower():
    """Every explore_every blocks at first; each exploration that confirms the kept way doubles
    the wait, up to MOST_BACKOFF times explore_every."""
    choice = OverlapChoice(LONE, block_rounds=2, explore_every=2)
    ways = run_blocks(choice, 120, {LOOK_AHEAD: 200.0, SEQUENTIAL: 100.0})
    explored = [i for i, way in enumerate(ways) if way == SEQUENTIAL]
    assert explored[0] == 1  # the first measurement
    gaps = [b - a - 1 for a, b in zip(explored[1:], explored[2:])]  # blocks of the kept way in between
    assert gaps[:5] == [4, 8, 16, 16, 16] == [min(2 ** (k + 1), MOST_BACKOFF) * 2 for k in range(5)]
    assert explored[1] - explored[0] - 1 == 2


def test_the_slower_ways_are_explored_in_turn():
    choice = OverlapChoice(BATCH, block_rounds=2, explore_every=2)
    ways = run_blocks(choice, 40, {SEQUENTIAL: 200.0, LOOK_AHEAD: 100.0, MICRO_BATCHES: 100.0})
    explored = [way for way in ways[3:] if way != SEQUENTIAL]
    assert explored[:4] == [LOOK_AHEAD, MICRO_BATCHES, LOOK_AHEAD, MICRO_BATCHES]


def test_a_way_that_other_kinds_of_step_measured_slower_is_not_measured_first():
    """presumed: the ways' rates over sequential rounds elsewhere. Slower by more than the
    margin: sequential rounds from the start, the slower way only explored later."""
    choice = OverlapChoice(BATCH, block_rounds=3, explore_every=4, presumed={LOOK_AHEAD: 0.9, MICRO_BATCHES: 0.99})
    rates = {SEQUENTIAL: 100.0, LOOK_AHEAD: 90.0, MICRO_BATCHES: 95.0}
    ways = run_blocks(choice, 6, rates)
    assert ways[:2] == [SEQUENTIAL, MICRO_BATCHES], "within the margin: measured"
    assert LOOK_AHEAD not in ways and choice.rates[LOOK_AHEAD] is None
    assert LOOK_AHEAD in run_blocks(choice, 6, rates), "explored in turn, as any slower way"


def test_a_way_that_other_kinds_of_step_measured_faster_runs_first():
    choice = OverlapChoice(BATCH, block_rounds=3, explore_every=100, presumed={MICRO_BATCHES: 1.2})
    ways = run_blocks(choice, 5, {SEQUENTIAL: 100.0, LOOK_AHEAD: 90.0, MICRO_BATCHES: 120.0})
    assert ways == [MICRO_BATCHES, SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES, MICRO_BATCHES]
    assert choice.ratio(MICRO_BATCHES) == pytest.approx(1.2) and choice.ratio(LOOK_AHEAD) == pytest.approx(0.9)


def test_a_way_within_the_margin_of_the_kept_one_does_not_take_over():
    choice = OverlapChoice(LONE, block_rounds=2, explore_every=100, margin=0.05)
    assert run_blocks(choice, 4, {LOOK_AHEAD: 100.0, SEQUENTIAL: 104.0}) == [LOOK_AHEAD, SEQUENTIAL] + [LOOK_AHEAD] * 2
    choice = OverlapChoice(LONE, block_rounds=2, explore_every=100, margin=0.05)
    assert run_blocks(choice, 4, {LOOK_AHEAD: 100.0, SEQUENTIAL: 106.0}) == [LOOK_AHEAD] + [SEQUENTIAL] * 3


def test_the_choice_follows_the_host_when_the_faster_way_changes():
    choice = OverlapChoice(LONE, block_rounds=2, explore_every=3, weight=0.5)
    ways = run_blocks(choice, 8, {LOOK_AHEAD: 200.0, SEQUENTIAL: 100.0})
    assert ways == [LOOK_AHEAD, SEQUENTIAL, LOOK_AHEAD, LOOK_AHEAD, LOOK_AHEAD, SEQUENTIAL, LOOK_AHEAD, LOOK_AHEAD]
    ways = run_blocks(choice, 16, {LOOK_AHEAD: 80.0, SEQUENTIAL: 100.0})  # the host lost its second core
    assert choice.rates[SEQUENTIAL] > choice.rates[LOOK_AHEAD]
    assert ways[-8:].count(SEQUENTIAL) >= 6  # sequential rounds, looking ahead only to re-measure


def test_noisy_blocks_do_not_flip_a_clear_choice():
    choice = OverlapChoice(LONE, block_rounds=8, explore_every=1000)
    ways = run_blocks(choice, 40, {LOOK_AHEAD: 130.0, SEQUENTIAL: 100.0}, noise=0.1, rng=random.Random(0))
    assert ways[2:] == [LOOK_AHEAD] * 38
    assert choice.changes == 2  # to measure sequential rounds once, and back


def test_a_block_of_a_way_other_than_the_kept_one_lasts_a_third_of_a_block():
    choice = OverlapChoice(BATCH, block_rounds=9, explore_every=1)
    lengths = []
    for _ in range(6):
        lengths.append((choice.way, choice.rounds_left))
        for _ in range(choice.rounds_left):
            choice.record(3, 3 / {SEQUENTIAL: 100.0, LOOK_AHEAD: 50.0, MICRO_BATCHES: 60.0}[choice.way])
    assert lengths[:3] == [(SEQUENTIAL, 9), (LOOK_AHEAD, 3), (MICRO_BATCHES, 3)]
    assert lengths[3:] == [(SEQUENTIAL, 9), (LOOK_AHEAD, 3), (SEQUENTIAL, 9)]


def test_only_whole_blocks_count_and_a_block_without_time_keeps_the_rate():
    choice = OverlapChoice(block_rounds=3)
    choice.record(3, 0.01)
    choice.record(3, 0.01)
    assert choice.rates[LOOK_AHEAD] is None and choice.looks_ahead
    choice.record(0, 0.0)
    assert choice.rates[LOOK_AHEAD] == pytest.approx(6 / 0.02)


@pytest.mark.parametrize("bad", [{"block_rounds": 0}, {"explore_every": 0}, {"weight": 0.0}, {"weight": 1.5},
                                 {"ways": ()}, {"margin": -0.1}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        OverlapChoice(**bad)
