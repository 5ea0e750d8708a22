"""Scheduler: waiting requests join in arrival order while the cache can reserve them; a
finished request leaves (saying whether it held cache); a preempted one frees its cache, is
queued first and keeps its first start; a step that preempts admits nothing."""

from __future__ import annotations

from specdec.requests.request import GenerationRequest
from specdec.requests.sequence import Sequence
from specdec.requests.stop_conditions import StopChecker
from specdec.round.scheduler import Scheduler


class Blocks:
    """A verifier's cache of `capacity` tokens: it admits reserves, in order, while they fit."""

    def __init__(self, capacity: int, grows: bool = False) -> None:
        self.capacity, self.grows_reserves, self.grown = capacity, grows, []

    def admits(self, reserves: list[int]) -> int:
        total = 0
        for i, tokens in enumerate(reserves):
            total += tokens
            if total > self.capacity:
                return i
        return len(reserves)

    def grow(self, reserves: list[tuple[str, int]], taken: list[int]) -> int:
        self.grown.append(reserves)
        return 0  # nothing fits: the scheduler must preempt


def sequence(seq_id: str, prompt_len: int, max_new: int = 10) -> Sequence:
    return Sequence(seq_id, GenerationRequest(list(range(1, prompt_len + 1)), max_new), StopChecker(max_new, ()))


def scheduler(released: list[str]) -> Scheduler:
    return Scheduler(round_tokens=5, chunk_budget=None, release=lambda seq: released.append(seq.seq_id))


def test_waiting_requests_join_in_order_while_their_full_reserves_fit():
    queue = scheduler([])
    queue.waiting.extend([sequence("a", 40), sequence("b", 40), sequence("c", 10)])
    queue.admit(Blocks(capacity=100))  # full reserves (prompt + 10): a and b (50 each) fill it; c (20) waits
    assert [s.seq_id for s in queue.running] == ["a", "b"] and [s.seq_id for s in queue.waiting] == ["c"]
    assert all(s.started_at is not None for s in queue.running)


def test_a_finished_request_leaves_and_says_whether_it_held_cache():
    queue = scheduler([])
    queue.waiting.append(sequence("w", 4))
    queue.running.append(sequence("r", 4))
    queue.placed.add("r")
    assert queue.remove(queue.running[0]) is True and not queue.running and "r" not in queue.placed
    assert queue.remove(queue.waiting[0]) is False and not queue.waiting


def test_when_grants_cannot_grow_the_newest_request_is_preempted_and_nothing_joins():
    released: list[str] = []
    queue = scheduler(released)
    old, new, waiting = sequence("old", 8), sequence("new", 8), sequence("next", 1)
    for seq in (old, new):
        seq.granted_tokens, seq.started_at = 8, 1.0  # the next round could pass every grant
        queue.running.append(seq)
        queue.placed.add(seq.seq_id)
    queue.waiting.append(waiting)
    queue.admit(Blocks(capacity=10**6, grows=True))
    assert released == ["new"] and queue.preemptions == 1 and [s.seq_id for s in queue.running] == ["old"]
    assert [s.seq_id for s in queue.waiting] == ["new", "next"], "queued first; the step admitted nothing"
    assert new.preempted and new.granted_tokens is None and new.started_at == 1.0 and "new" not in queue.placed


def test_a_request_passed_over_and_then_aborted_leaves_no_count_behind():
    """Admission counts what was admitted past a waiting request; one that leaves the queue
    unadmitted (aborted) is forgotten at once, so steps with nothing waiting need not ask
    admission anything, and a later request of the same id starts from nothing."""
    queue = scheduler([])
    long, short = sequence("long", 90), sequence("short", 10)
    queue.waiting.extend([long, short])
    queue.admit(Blocks(capacity=50))  # long (100) does not fit; short (20) passes it
    assert [s.seq_id for s in queue.running] == ["short"] and queue.admission.passed("long") == 20
    queue.remove(long)
    assert queue.admission.passed("long") == 0 and not queue.waiting
