"""CacheGrants: a request is admitted on its next round's need plus a watermark, and its grant
grows by the same step only when a round could pass it, never past prompt + max_new_tokens."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("round_tokens, watermark", [(0, 16), (5, -1)])
def test_impossible_steps_are_refused(round_tokens, watermark):
    with pytest.raises(ValueError):
        CacheGrants(round_tokens, watermark)
