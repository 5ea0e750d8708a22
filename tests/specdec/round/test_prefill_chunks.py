"""PrefillChunks: each round reads at most the budget of prompt tokens, first come first served."""

import pytest

from specdec.round.prefill_chunks import PrefillChunks
from specdec.round.prefill_pace import PrefillPace
from specdec.requests.request import GenerationRequest
from specdec.requests.sequence import Sequence
from specdec.requests.stop_conditions import StopChecker


def row(prompt_len: int, decoding: bool = False) -> Sequence:
    seq = Sequence(f"s{prompt_len}", GenerationRequest(list(range(1, prompt_len + 1)), 8), StopChecker(8, ()))
    seq.stats.rounds = int(decoding)
    return seq


def test_without_a_budget_every_row_reads_its_whole_prompt():
    rows = [row(900), row(5)]
    assert PrefillChunks(0).plan(rows) == rows and PrefillChunks(None).plan(rows) == rows
    assert all(seq.chunk_end is None for seq in rows)


def test_a_long_prompt_is_read_in_chunks_and_its_last_chunk_is_an_ordinary_round():
    chunks, seq = PrefillChunks(64), row(150)
    ends = []
    while True:
        assert chunks.plan([seq]) == [seq]
        if seq.chunk_end is None:
            break
        ends.append(seq.chunk_end)
        chunks.done([seq])
    assert ends == [64, 128] and seq.prefilled == 128  # the last round reads the 22 left (with the pending token)


def test_decoding_rows_always_take_part_and_the_budget_is_shared_in_order():
    decoding, first, second, third = row(3, decoding=True), row(40), row(100), row(30)
    taking_part = PrefillChunks(64).plan([decoding, first, second, third])
    assert taking_part == [decoding, first, second]  # the third waits for budget
    assert first.chunk_end is None  # 40 tokens fit: its whole first round
    assert second.chunk_end == 24  # the 24 left of the budget


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        PrefillChunks(-1)


def test_while_rows_decode_the_pace_bounds_the_budget_and_learns_from_the_round():
    pace = PrefillPace(0.2, min_tokens=16)
    chunks, decoding, prompt = PrefillChunks(256, pace), row(3, decoding=True), row(900)
    chunks.plan([decoding, prompt])
    assert prompt.chunk_end == 16  # nothing measured yet: the smallest chunk
    chunks.round_done(0.02)
    assert pace.allowance() == 0  # a decode round is measured before the next chunk
    chunks.done([prompt])
    assert chunks.plan([decoding, prompt]) == [decoding] and prompt.chunk_end is None
    chunks.round_done(0.01)
    assert pace.decode_s == 0.01


def test_with_no_row_decoding_a_prompt_reads_the_whole_budget():
    chunks, prompt = PrefillChunks(256, PrefillPace(0.2, min_tokens=16)), row(900)
    chunks.plan([prompt])
    assert prompt.chunk_end == 256


def test_while_rows_decode_a_prompt_the_budget_reads_at_once_is_not_paced():
    pace = PrefillPace(0.2, min_tokens=16)
    pace.record(0.01, 0)
    pace.record(0.05, 16)  # in debt: long prompts wait
    chunks, decoding, short, long = PrefillChunks(256, pace), row(3, decoding=True), row(200), row(900)
    assert chunks.plan([decoding, long, short]) == [decoding, short]
    assert short.chunk_end is None and long.chunk_end is None  # the short one's whole first round, now


def test_beside_decoding_rows_a_paced_prompt_is_read_in_riding_chunks_its_first_round_reads_one_token():
    """While rows decode, a long prompt's chunks are the decode rows' width (they ride their verify
    forward) and its last chunk stops one token short, so its first round has no catch-up either."""
    chunks, decoding, seq = PrefillChunks(256, PrefillPace(0.2)), row(3, decoding=True), row(300)
    ends = []
    for _ in range(400):
        taking_part = chunks.plan([decoding, seq], width=5)
        if seq in taking_part and seq.chunk_end is None:
            break  # its first round
        read = seq.chunk_end is not None
        if read:
            ends.append(seq.chunk_end)
            chunks.done([seq])
        chunks.round_done(0.012 if read else 0.010)  # a chunk adds 2 ms (most of the per-round cap, 4 ms)
    assert ends[:3] == [5, 10, 15] and max(b - a for a, b in zip(ends, ends[1:])) == 5
    assert ends[-1] == 299  # all but the pending token
    assert len(seq.token_ids) - seq.prefilled == 1
