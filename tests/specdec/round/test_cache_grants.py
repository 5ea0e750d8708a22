"""CacheGrants: a request is admitted on its next round's need plus a watermark, and its grant
grows by the same step only when a round could pass it, never past prompt + max_new_tokens."""

from __future__ import annotations

import pytest

from specdec.requests.errors import WorkerError
from specdec.requests.request import GenerationRequest
from specdec.requests.sequence import Sequence
from specdec.requests.stop_conditions import StopChecker
from specdec.round.cache_grants import CacheGrants


def sequence(prompt_len: int, max_new: int) -> Sequence:
    return Sequence("s", GenerationRequest(list(range(1, prompt_len + 1)), max_new), StopChecker(max_new, ()))


def test_admission_reserves_the_next_round_and_the_watermark_not_the_whole_request():
    grants, seq = CacheGrants(round_tokens=5, watermark=16), sequence(100, 500)
    assert grants.admission(seq) == 100 + 5 + 16
    assert seq.reserve_tokens == 600, "no grant yet: the full reserve"


def test_a_grant_never_exceeds_prompt_plus_max_new_tokens():
    grants, seq = CacheGrants(round_tokens=5, watermark=16), sequence(100, 8)
    assert grants.admission(seq) == 108


def test_a_row_grows_only_when_its_next_round_could_pass_its_grant():
    grants, seq = CacheGrants(round_tokens=5, watermark=16), sequence(100, 500)
    seq.granted_tokens = grants.admission(seq)
    seq.token_ids += [7] * 16  # 116 tokens: one more round writes up to 121 = the grant
    assert grants.short([seq]) == []
    seq.token_ids.append(7)  # 117: the next round could write the 122nd token
    assert grants.short([seq]) == [(seq, 117 + 5 + 16)]


def test_a_reset_request_holds_nothing_and_reads_its_history_again():
    grants, seq = CacheGrants(round_tokens=5), sequence(100, 500)
    seq.granted_tokens, seq.prefilled = 130, 64
    grants.reset(seq)
    assert (seq.granted_tokens, seq.prefilled, seq.chunk_end) == (None, 0, None)


def test_a_prompt_read_in_chunks_is_granted_its_next_chunk_not_the_whole_prompt():
    grants, seq = CacheGrants(round_tokens=5, chunk_tokens=64, watermark=16), sequence(300, 50)
    assert grants.admission(seq) == 64 + 5 + 16
    seq.granted_tokens, seq.prefilled = grants.admission(seq), 64
    assert grants.short([seq]) == [(seq, 128 + 5 + 16)], "the next chunk could pass the grant"
    seq.prefilled = 256  # its last chunk: the prompt's rest and its first round
    assert grants.needed(seq) == 300 + 5


@pytest.mark.parametrize("round_tokens, chunk_tokens, watermark", [(0, None, 16), (5, None, -1), (5, 0, 16)])
def test_impossible_steps_are_refused(round_tokens, chunk_tokens, watermark):
    with pytest.raises(ValueError):
        CacheGrants(round_tokens, chunk_tokens, watermark)


class TokenPool:
    """A verifier's growth bookkeeping in tokens: each held sequence's reserve within a capacity."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.held = capacity, {}

    def grow(self, reserves: list[tuple[str, int]], taken: list[int]) -> int:
        room = self.capacity - sum(self.held.values()) - sum(taken)
        for count, (seq_id, tokens) in enumerate(reserves):
            extra = max(0, tokens - self.held.get(seq_id, 0))
            if extra > room:
                return count
            self.held[seq_id], room = max(tokens, self.held.get(seq_id, 0)), room - extra
        return len(reserves)


def no_failure(seq: Sequence, exc: Exception) -> None:
    pytest.fail(f"failed {seq.seq_id}: {exc}")


def running_pool(capacity: int, count: int,
                 pool: TokenPool | None = None) -> tuple[TokenPool, list[Sequence], CacheGrants]:
    """`count` requests of 10 prompt tokens admitted (granted 10 + 5 + 5) and decoded to 20 tokens."""
    grants, pool, running = CacheGrants(round_tokens=5, watermark=5), pool or TokenPool(capacity), []
    for i in range(count):
        seq = sequence(10, 100)
        seq.seq_id, seq.granted_tokens = f"s{i}", grants.admission(seq)
        pool.held[seq.seq_id] = seq.granted_tokens
        seq.token_ids += [7] * 10
        running.append(seq)
    return pool, running, grants


def test_make_room_grows_every_short_grant_when_the_pool_covers_them():
    pool, running, grants = running_pool(capacity=90, count=3)
    preempted = []
    assert not grants.make_room(running, {s.seq_id for s in running}, pool, preempted.append, no_failure)
    assert [s.reserve_tokens for s in running] == [30, 30, 30] and preempted == []


def test_make_room_preempts_the_most_recently_admitted_until_the_older_ones_grow():
    pool, running, grants = running_pool(capacity=70, count=3)
    preempted = []

    def preempt(seq):
        preempted.append(seq.seq_id)
        running.remove(seq)
        pool.held.pop(seq.seq_id)

    assert grants.make_room(running, {s.seq_id for s in running}, pool, preempt, no_failure)
    assert preempted == ["s2"] and [s.reserve_tokens for s in running] == [30, 30]


def test_make_room_never_preempts_the_last_request_running():
    pool, running, grants = running_pool(capacity=25, count=1)
    assert not grants.make_room(running, {"s0"}, pool, lambda seq: pytest.fail("preempted the last one"), no_failure)


class BrokenRow(TokenPool):
    """Growth that raises for one sequence (say its slot state broke), whatever else it is asked."""

    def __init__(self, capacity: int, broken: str) -> None:
        super().__init__(capacity)
        self.broken = broken

    def grow(self, reserves: list[tuple[str, int]], taken: list[int]) -> int:
        if any(seq_id == self.broken for seq_id, _ in reserves):
            raise RuntimeError(f"cannot grow {self.broken}")
        return super().grow(reserves, taken)


def test_a_row_whose_growth_raises_fails_alone_and_the_others_grow():
    pool, running, grants = running_pool(90, 3, BrokenRow(90, broken="s1"))
    failed = []

    def fail(seq, exc):
        failed.append((seq.seq_id, str(exc)))
        running.remove(seq)

    assert not grants.make_room(running, {s.seq_id for s in running}, pool, lambda seq: pytest.fail("preempted"), fail)
    assert failed == [("s1", "cannot grow s1")]
    assert [(s.seq_id, s.reserve_tokens) for s in running] == [("s0", 30), ("s2", 30)]


def test_a_target_that_is_down_while_growing_fails_the_step_as_a_round_would():
    pool, running, grants = running_pool(capacity=90, count=2)

    class Down(TokenPool):
        def grow(self, reserves, taken):
            raise WorkerError("target unreachable")

    with pytest.raises(WorkerError):
        grants.make_room(running, {s.seq_id for s in running}, Down(90), lambda seq: None, no_failure)
