"""Admission past a blocked head: a waiting request that fits may go before one ahead of it that
does not, until the one passed over has seen its own reserve admitted past it; then it goes
first. Nothing is ever admitted beyond what the cache's `admits` allows."""

from __future__ import annotations

import random

from specdec.round.admission import Admission


class Pool:
    """A cache of ``free`` tokens and ``slots`` sequences: admits counts reserves in order."""

    def __init__(self, free: int, slots: int = 100) -> None:
        self.free, self.slots, self.calls = free, slots, []

    def admits(self, reserves: list[int]) -> int:
        self.calls.append(list(reserves))
        left = self.free
        for count, reserve in enumerate(reserves):
            if count >= self.slots or reserve > left:
                return count
            left -= reserve
        return len(reserves)


def queue(*reserves: int) -> list[tuple[str, int]]:
    return [(f"r{i}", reserve) for i, reserve in enumerate(reserves)]


def test_a_short_request_behind_a_long_one_that_does_not_fit_is_admitted():
    assert Admission().choose(Pool(500).admits, [], queue(2000, 300)) == [1]


def test_requests_that_fit_are_admitted_in_arrival_order():
    assert Admission().choose(Pool(1000).admits, [], queue(300, 300, 300, 300)) == [0, 1, 2]


def test_sequences_not_yet_holding_their_blocks_are_counted_first():
    assert Admission().choose(Pool(500).admits, [400], queue(300, 100)) == [1]


def test_a_head_passed_over_by_its_own_reserve_blocks_passing_and_goes_first_once_memory_frees():
    admission, pool = Admission(), Pool(500)
    waiting = queue(1000, 400, 400, 400)
    assert admission.choose(pool.admits, [], waiting) == [1]  # 400 of the head's 1,000 passed
    assert admission.passed("r0") == 400
    pool.free = 400
    assert admission.choose(pool.admits, [], [waiting[0], *waiting[2:]]) == [1]
    assert admission.passed("r0") == 800
    pool.free = 400
    assert admission.choose(pool.admits, [], [waiting[0], waiting[3]]) == [1]  # 1,200 >= 1,000: passed enough
    pool.free = 900  # room for the last short one, not for the head: it waits behind the head
    assert admission.choose(pool.admits, [], [waiting[0], ("r4", 100)]) == []
    pool.free = 1000
    assert admission.choose(pool.admits, [], [waiting[0], ("r4", 100)]) == [0]
    assert admission.passed("r0") == 0, "an admitted request is forgotten"


def test_any_request_passed_enough_stops_passing_behind_it():
    admission, pool = Admission(), Pool(100)
    waiting = queue(2000, 300, *[100] * 5)
    for _ in range(3):  # the short ones pass both: 300 tokens, all of r1's reserve
        chosen = admission.choose(pool.admits, [], waiting)
        assert chosen == [2]
        waiting = [w for i, w in enumerate(waiting) if i not in chosen]
    assert (admission.passed("r0"), admission.passed("r1")) == (300, 300)
    assert admission.choose(Pool(200).admits, [], waiting) == [], "r1 goes before the short ones now"
    assert admission.choose(Pool(300).admits, [], waiting) == [1], "the head, not passed enough, may be passed by r1"


def test_nothing_is_admitted_beyond_what_admits_allows():
    rng = random.Random(0)
    admission, admitted = Admission(), 0
    waiting = [(f"r{i}", rng.choice([rng.randint(16, 300), rng.randint(300, 2100)])) for i in range(200)]
    for step in range(300):
        pool = Pool(rng.randint(0, 4000), slots=rng.randint(0, 12))
        taken = [rng.randint(16, 500) for _ in range(rng.randint(0, 2))]
        chosen = admission.choose(pool.admits, taken, waiting)
        reserves = [*taken, *(waiting[i][1] for i in chosen)]
        assert not chosen or pool.admits(reserves) == len(reserves), f"step {step} admitted past the cache"
        assert chosen == sorted(chosen)
        admitted += len(chosen)
        waiting = [w for i, w in enumerate(waiting) if i not in set(chosen)]
        if not waiting:
            break
    assert admitted > 100, "the check ran on real admissions"
