"""PrefillPace: while rows decode, prompt chunks are sized from measured round times so that
they lengthen the decode rounds by at most `slowdown` on average (each round by about twice
it at most), and every prompt still progresses."""

import pytest

from specdec.round.prefill_pace import PrefillPace

DECODE_S = 0.010  # a decode round of the simulated device


def round_s(tokens: int, per_token: float, fixed: float) -> float:
    """A simulated round: the decode round plus what its prompt tokens add."""
    return DECODE_S + (fixed + per_token * tokens if tokens else 0.0)


def simulate(pace: PrefillPace, rounds: int, per_token: float, fixed: float = 0.0) -> tuple[float, int, list[float]]:
    """-> (average share prompts added to the rounds, prompt tokens read, each round's time)."""
    times, read = [], 0
    for _ in range(rounds):
        tokens = pace.allowance()
        seconds = round_s(tokens, per_token, fixed)
        pace.record(seconds, tokens)
        times.append(seconds)
        read += tokens
    return sum(times) / (rounds * DECODE_S) - 1, read, times


def test_before_anything_is_measured_a_chunk_is_the_smallest_one():
    assert PrefillPace(0.2, min_tokens=16).allowance() == 16


def test_a_chunk_grows_to_what_the_per_round_cap_allows_but_at_most_doubles_each_time():
    pace = PrefillPace(0.2, min_tokens=16)
    pace.record(DECODE_S, 0)
    sizes = []
    for _ in range(12):
        tokens = pace.allowance()
        if tokens:
            sizes.append(tokens)
        pace.record(round_s(tokens, 1e-5, 0.0), tokens)  # 0.01 ms a token: the cap (4 ms) fits 400
    assert all(b <= 2 * a for a, b in zip(sizes, sizes[1:]))
    assert max(sizes) == pytest.approx(400, rel=0.05)


@pytest.mark.parametrize("per_token, fixed", [(1e-5, 0.0), (1e-4, 0.002), (5e-4, 0.008)])
def test_prompts_slow_the_decode_rounds_by_at_most_the_share_on_average(per_token, fixed):
    share, read, times = simulate(PrefillPace(0.2), 400, per_token, fixed)
    assert share <= 0.2 + 0.02
    assert read > 0  # every prompt progresses, even where the smallest chunk costs more than the cap
    if fixed + 16 * per_token <= 2 * 0.2 * DECODE_S:  # a chunk fits the per-round cap
        assert max(times) <= DECODE_S * (1 + 2 * 0.2) * 1.05


def test_a_round_that_overspent_is_paid_back_before_the_next_chunk():
    pace = PrefillPace(0.2)
    pace.record(DECODE_S, 0)
    pace.record(DECODE_S * 3, 16)  # the chunk added two decode rounds' time
    waited = 0
    while pace.allowance() == 0:
        pace.record(DECODE_S, 0)
        waited += 1
    assert waited >= 3


def test_the_share_must_be_positive():
    with pytest.raises(ValueError, match="slowdown"):
        PrefillPace(0)


def test_a_chunk_is_at_least_what_rides_the_decode_rows_forward():
    """The floor is the round's widest verify row (γ + 1), at least MIN_TOKENS: every prompt progresses."""
    assert PrefillPace(0.2).allowance(width=9) == 9
    assert PrefillPace(0.2).allowance(width=1) == PrefillPace(0.2).min_tokens


def test_no_wider_chunk_is_tried_where_a_riding_one_uses_much_of_the_cap():
    """On a CPU a chunk wider than the decode rows needs a forward of its own (a third of a decode
    round before it reads a token): riding chunks that already use much of the per-round cap never
    lead to one, so no round is slowed by more than a riding chunk."""
    pace, times = PrefillPace(0.15), []
    pace.record(DECODE_S, 0)
    for _ in range(200):
        tokens = pace.allowance(width=5)
        wide = DECODE_S / 3 if tokens > 5 else 0.0
        seconds = round_s(tokens, 0.03 * DECODE_S, wide)  # a riding chunk adds 15 %: half the cap
        pace.record(seconds, tokens)
        times.append(seconds)
    assert max(times) <= DECODE_S * 1.16
    assert sum(1 for t in times if t > DECODE_S) > 50  # and a chunk rides most rounds the credit allows
