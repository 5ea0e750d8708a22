"""OverlapChoice: which way a kind of step runs (sequential, looking ahead, micro-batches)
follows pairs of blocks (a way's block against the kept way's rounds around it); another way
takes over only when clearly faster; while undecided the others run after every kept block,
once settled ever more rarely; what other kinds of step measured decides which ways are
worth measuring first."""

from __future__ import annotations

import math
import random

import pytest

from specdec.round.overlap_choice import (
    EARLY_ROUNDS,
    EXIT_BLOCKS,
    LOOK_AHEAD,
    MICRO_BATCHES,
    MIN_PAIRS,
    MOST_BACKOFF,
    SEQUENTIAL,
    OverlapChoice,
    Pairs,
)

LONE = (LOOK_AHEAD, SEQUENTIAL)
BATCH = (SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES)


def run_blocks(choice: OverlapChoice, blocks: int, rate, noise: float = 0.0,
               rng: random.Random | None = None) -> list[str]:
    """Feed `blocks` blocks of rounds, each emitting 3 tokens at the chosen way's rate (±noise);
    `rate`: way -> tokens/s, or a function (way, round number) -> tokens/s. Returns the way
    each block ran."""
    ways, n = [], 0
    for _ in range(blocks):
        ways.append(choice.way)
        for _ in range(choice.rounds_left):
            speed = rate(choice.way, n) if callable(rate) else rate[choice.way]
            speed *= 1 + (rng.uniform(-noise, noise) if rng else 0.0)
            choice.record(3, 3 / speed)
            n += 1
    return ways


def test_the_first_way_is_kept_until_another_is_clearly_faster_then_that_one():
    """MIN_PAIRS pairs (a sequential block against the look-ahead rounds around it) are needed
    before a way can be clearly faster; while undecided, sequential runs after every
    explore_every kept blocks."""
    choice = OverlapChoice(LONE, block_rounds=6, explore_every=2)
    ways = run_blocks(choice, 20, {LOOK_AHEAD: 100.0, SEQUENTIAL: 150.0})
    assert ways[:8] == [LOOK_AHEAD, SEQUENTIAL] + [LOOK_AHEAD, LOOK_AHEAD, SEQUENTIAL] * 2
    assert ways.count(SEQUENTIAL) >= 10 and ways[-5:].count(SEQUENTIAL) >= 4
    assert choice.rates == {LOOK_AHEAD: pytest.approx(100.0), SEQUENTIAL: pytest.approx(150.0)}
    assert choice.pairs[LOOK_AHEAD].mean == pytest.approx(-0.405, abs=1e-3)  # log(100 / 150)


def test_with_three_ways_the_fastest_of_them_is_kept():
    choice = OverlapChoice(BATCH, block_rounds=6, explore_every=2)
    ways = run_blocks(choice, 60, {SEQUENTIAL: 100.0, LOOK_AHEAD: 90.0, MICRO_BATCHES: 140.0})
    assert ways[1] == LOOK_AHEAD and MICRO_BATCHES in ways[:5]
    assert ways[-8:] == [MICRO_BATCHES] * 8
    assert not choice.looks_ahead


def test_when_looking_ahead_is_faster_it_is_kept_and_explored_ever_more_rarely():
    """Undecided (fewer than MIN_PAIRS pairs): sequential runs after every explore_every
    kept blocks. Settled: every explore_every blocks at first; each exploration that confirms
    the kept way doubles the wait, up to MOST_BACKOFF times explore_every."""
    choice = OverlapChoice(LONE, block_rounds=6, explore_every=3)
    ways = run_blocks(choice, 200, {LOOK_AHEAD: 200.0, SEQUENTIAL: 100.0})
    assert choice.looks_ahead and choice.changes == ways.count(SEQUENTIAL) * 2
    explored = [i for i, way in enumerate(ways) if way == SEQUENTIAL]
    gaps = [b - a - 1 for a, b in zip(explored, explored[1:])]  # kept blocks in between
    assert explored[0] == 1 and gaps[:MIN_PAIRS - 1] == [3] * (MIN_PAIRS - 1)
    assert gaps[MIN_PAIRS - 1:MIN_PAIRS + 4] == [3, 6, 12, 24, 24] == [3 * min(2 ** k, MOST_BACKOFF) for k in range(5)]


def test_the_slower_ways_are_explored_in_turn():
    choice = OverlapChoice(BATCH, block_rounds=6, explore_every=2)
    ways = run_blocks(choice, 60, {SEQUENTIAL: 200.0, LOOK_AHEAD: 100.0, MICRO_BATCHES: 100.0})
    explored = [way for way in ways if way != SEQUENTIAL]
    assert explored[:6] == [LOOK_AHEAD, MICRO_BATCHES] * 3


def test_a_way_that_other_kinds_of_step_measured_slower_is_not_measured_first():
    """presumed: the ways' rates over sequential rounds elsewhere. Slower by more than the
    margin: not measured until the kept way is settled against the others."""
    choice = OverlapChoice(BATCH, block_rounds=6, explore_every=4, presumed={LOOK_AHEAD: 0.9, MICRO_BATCHES: 0.99})
    rates = {SEQUENTIAL: 100.0, LOOK_AHEAD: 90.0, MICRO_BATCHES: 80.0}
    ways = run_blocks(choice, 12, rates)
    assert ways[:2] == [SEQUENTIAL, MICRO_BATCHES], "within the margin: measured"
    assert LOOK_AHEAD not in ways and choice.rates[LOOK_AHEAD] is None
    assert LOOK_AHEAD in run_blocks(choice, 30, rates), "explored in turn, as any slower way"


def test_a_way_that_other_kinds_of_step_measured_faster_runs_first():
    choice = OverlapChoice(BATCH, block_rounds=6, explore_every=100, presumed={MICRO_BATCHES: 1.2})
    ways = run_blocks(choice, 40, {SEQUENTIAL: 100.0, LOOK_AHEAD: 90.0, MICRO_BATCHES: 120.0})
    assert ways[0] == MICRO_BATCHES and ways.count(MICRO_BATCHES) > 25 and ways[-4:] == [MICRO_BATCHES] * 4
    assert choice.ratio(MICRO_BATCHES) == pytest.approx(1.2) and choice.ratio(LOOK_AHEAD) == pytest.approx(0.9)


def test_a_way_within_the_margin_of_the_kept_one_does_not_take_over():
    choice = OverlapChoice(LONE, block_rounds=6, explore_every=100, margin=0.05)
    assert set(run_blocks(choice, 30, {LOOK_AHEAD: 100.0, SEQUENTIAL: 104.0})[12:]) == {LOOK_AHEAD}
    choice = OverlapChoice(LONE, block_rounds=6, explore_every=2, margin=0.05)
    assert run_blocks(choice, 30, {LOOK_AHEAD: 100.0, SEQUENTIAL: 106.0})[-4:].count(SEQUENTIAL) >= 3


def test_the_choice_follows_the_host_when_the_faster_way_changes():
    choice = OverlapChoice(LONE, block_rounds=6, explore_every=3)
    run_blocks(choice, 20, {LOOK_AHEAD: 200.0, SEQUENTIAL: 100.0})
    assert choice.looks_ahead
    ways = run_blocks(choice, 150, {LOOK_AHEAD: 80.0, SEQUENTIAL: 100.0})  # the host lost its second core
    assert ways[-8:].count(SEQUENTIAL) >= 6  # sequential rounds, looking ahead only to re-measure


def test_requests_of_different_difficulty_do_not_make_the_slower_way_look_faster():
    """A request's text moves both ways' rates alike (here ±40 % every 20 rounds); looking
    ahead is 17 % faster throughout. Judged in pairs it is kept for most rounds (the old
    rule, comparing each way's blocks far apart, kept sequential rounds for most of the run)."""
    def rate(way, n):
        difficulty = (1.4, 0.6, 1.0, 0.8, 1.2)[(n // 20) % 5]
        return difficulty * (117.0 if way == LOOK_AHEAD else 100.0)

    choice = OverlapChoice(LONE)
    ways = run_blocks(choice, 40, rate, noise=0.2, rng=random.Random(1))
    assert choice.looks_ahead
    assert ways.count(LOOK_AHEAD) * 24 >= 0.85 * (ways.count(LOOK_AHEAD) * 24 + ways.count(SEQUENTIAL) * 8)
    assert choice.pairs[SEQUENTIAL].mean < 0


def test_a_clearly_slower_first_way_is_left_within_a_few_pairs_despite_noise():
    choice = OverlapChoice(LONE)
    ways = run_blocks(choice, 40, {LOOK_AHEAD: 80.0, SEQUENTIAL: 100.0}, noise=0.3, rng=random.Random(2))
    assert ways[-10:].count(SEQUENTIAL) >= 8


def test_noisy_blocks_do_not_flip_a_clear_choice():
    choice = OverlapChoice(LONE, block_rounds=24, explore_every=1000)
    ways = run_blocks(choice, 60, {LOOK_AHEAD: 130.0, SEQUENTIAL: 100.0}, noise=0.3, rng=random.Random(0))
    assert SEQUENTIAL not in ways[20:] and LOOK_AHEAD not in {w for w in ways[1::2][:1] if w != SEQUENTIAL}
    assert choice.looks_ahead


def test_a_block_of_a_way_other_than_the_kept_one_lasts_a_third_of_a_block():
    choice = OverlapChoice(BATCH, block_rounds=9, explore_every=1)
    lengths = []
    for _ in range(5):
        lengths.append((choice.way, choice.rounds_left))
        for _ in range(choice.rounds_left):
            choice.record(3, 3 / {SEQUENTIAL: 100.0, LOOK_AHEAD: 50.0, MICRO_BATCHES: 60.0}[choice.way])
    assert lengths == [(SEQUENTIAL, 9), (LOOK_AHEAD, 3), (SEQUENTIAL, 9), (MICRO_BATCHES, 3), (SEQUENTIAL, 9)]


def test_only_whole_blocks_count_and_a_block_without_time_keeps_the_rate():
    choice = OverlapChoice(block_rounds=3)
    choice.record(3, 0.01)
    choice.record(3, 0.01)
    assert choice.rates[LOOK_AHEAD] is None and choice.looks_ahead
    choice.record(0, 0.0)
    assert choice.rates[LOOK_AHEAD] == pytest.approx(6 / 0.02)


def test_pairs_weigh_older_ones_less_and_have_no_error_before_enough():
    pairs = Pairs()
    for log_ratio in (0.1, 0.3, 0.2)[:MIN_PAIRS - 1]:
        pairs.add(log_ratio)
        assert pairs.error == float("inf")
    assert pairs.mean == pytest.approx((0.81 * 0.1 + 0.9 * 0.3 + 0.2) / 2.71)
    for _ in range(MIN_PAIRS):
        pairs.add(0.2)
    assert 0 < pairs.error < 0.05 and pairs.negated().mean == pytest.approx(-pairs.mean)


@pytest.mark.parametrize("bad", [{"block_rounds": 0}, {"explore_every": 0}, {"weight": 0.0}, {"weight": 1.5},
                                 {"ways": ()}, {"margin": -0.1}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        OverlapChoice(**bad)


# --- the fast exit: sequential rounds' rate predicted on the kept way's own rounds ---------------


def accepted_prefix(rng: random.Random, alpha: float, drafts: int) -> int:
    accepted = 0
    while accepted < drafts and rng.random() < alpha:
        accepted += 1
    return accepted


def lone_run(ratio: float, seed: int, predict: bool = True, rounds: int = 400) -> tuple[list[str], int | None]:
    """A lone row, γ 4: every round's text accepts a prefix of the drafts (α 0.55-0.85, a new
    request every 40 rounds); a sequential round emits that prefix + 1 in 12 ms; a look-ahead
    round emits it cut at 3 drafts + 1, or 1 token after a miss (a quarter of the rounds), and
    takes the time that makes its mean rate `ratio` times sequential rounds'; ±7 % time noise
    per round and a slow ±10 % drift of the host. predict: the look-ahead rounds say what a
    sequential round would have emitted there. -> (each round's way, the round sequential
    rounds took over at, if they did)."""
    rng, choice = random.Random(seed), OverlapChoice(LONE)
    look_ahead_tokens = 0.75 * sum(0.7 ** j for j in range(4)) + 0.25  # at α 0.7
    sequential_tokens = sum(0.7 ** j for j in range(5))
    look_ahead_s = look_ahead_tokens * 0.012 / (ratio * sequential_tokens)
    ways, left, alpha = [], None, 0.7
    for n in range(rounds):
        alpha = rng.uniform(0.55, 0.85) if n % 40 == 0 else alpha
        host = (1 + 0.1 * math.sin(n / 60)) * rng.uniform(0.93, 1.07)
        accepted = accepted_prefix(rng, alpha, 4)
        ways.append(choice.way)
        if choice.way == SEQUENTIAL:
            choice.record(accepted + 1, 0.012 * host)
        else:
            tokens = 1 if rng.random() < 0.25 else min(accepted, 3) + 1
            choice.record(tokens, look_ahead_s * host, accepted + 1 if predict else None)
        if left is None and choice._kept == SEQUENTIAL:
            left = n
    return ways, left


def test_a_look_ahead_clearly_slower_than_predicted_sequential_rounds_is_left_within_a_few_blocks():
    """15 % slower: the pairs alone keep looking ahead for all 400 rounds (too noisy to be sure
    within a run); the prediction leaves it within about four blocks."""
    runs = [lone_run(0.85, seed) for seed in range(10)]
    assert all(lone_run(0.85, seed, predict=False)[1] is None for seed in range(3))
    assert all(left is not None for _, left in runs)
    assert sorted(left for _, left in runs)[7] <= 130
    assert all(ways.count(LOOK_AHEAD) <= 0.5 * len(ways) for ways, _ in runs)


@pytest.mark.parametrize("ratio, most_exits", [(1.0, 1), (1.17, 0)])
def test_a_look_ahead_as_fast_or_faster_keeps_what_the_pairs_decide(ratio, most_exits):
    """Noisy but equal, or a small real gain (measured at one stream): the prediction (almost)
    never leads by the exit margin three blocks in a row, so every round runs as without it."""
    changed = sum(lone_run(ratio, seed)[0] != lone_run(ratio, seed, predict=False)[0] for seed in range(20))
    assert changed <= most_exits


def test_no_fast_exit_before_sequential_rounds_were_timed_or_for_a_kept_sequential_way():
    choice = OverlapChoice(LONE, block_rounds=6, explore_every=100)
    for _ in range(6):
        choice.record(1, 0.02, sequential_tokens=5.0)  # looking ahead: 50 tokens/s, predicted far better
        assert choice.predicted_sequential is None
    assert choice.way == SEQUENTIAL and choice._kept == LOOK_AHEAD, "measuring sequential rounds, not leaving"
    kept = OverlapChoice(BATCH, block_rounds=6, explore_every=100)
    for _ in range(6 * EXIT_BLOCKS):
        kept.record(3, 0.01, sequential_tokens=1.0)
    assert kept._kept == SEQUENTIAL and not kept._predicted, "explorations' rounds predict nothing"


@pytest.mark.parametrize("look_ahead_s, explored_rounds", [(0.02, 1 + EARLY_ROUNDS), (0.0105, 8)])
def test_an_exploration_clearly_behind_predicted_sequential_rounds_ends_early(look_ahead_s, explored_rounds):
    """Several rows, sequential rounds kept (3 tokens in 10 ms): a look-ahead exploration whose
    rounds would have emitted as much sequentially but take twice as long ends after its first
    (uncounted) round and EARLY_ROUNDS more; one 5 % slower runs its whole third of a block."""
    choice = OverlapChoice(BATCH, block_rounds=24, explore_every=100)
    for _ in range(24):
        choice.record(3, 0.01)
    assert choice.way == LOOK_AHEAD and choice.sequential_round_s == pytest.approx(0.01)
    rounds = 0
    while choice.way == LOOK_AHEAD:
        choice.record(3, look_ahead_s, sequential_tokens=3.0)
        rounds += 1
    assert rounds == explored_rounds and choice._kept == SEQUENTIAL
