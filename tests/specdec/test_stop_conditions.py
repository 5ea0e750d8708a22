"""A sequence ends at max_new_tokens, at EOS, or at a stop string; a round's extra tokens are cut."""

import pytest

from specdec.stop_conditions import FINISH_LENGTH, FINISH_STOP, StopChecker

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def decode(ids):
    return "".join(LETTERS[i] for i in ids)


def test_keeps_going_below_the_budget():
    d = StopChecker(max_new_tokens=10).check([1, 2, 3], num_new=3)
    assert (d.finish_reason, d.num_tokens) == (None, 3)


def test_cuts_a_round_that_overshoots_max_new_tokens():
    d = StopChecker(max_new_tokens=4).check([1, 2, 3, 4, 5, 6], num_new=5)
    assert (d.finish_reason, d.num_tokens) == (FINISH_LENGTH, 4)


def test_eos_ends_the_sequence_and_is_kept():
    d = StopChecker(max_new_tokens=10, eos_token_ids=[0]).check([1, 2, 0, 5], num_new=3)
    assert (d.finish_reason, d.num_tokens) == (FINISH_STOP, 3)


def test_eos_on_the_last_allowed_token_reports_stop():
    d = StopChecker(max_new_tokens=3, eos_token_ids=[0]).check([1, 2, 0], num_new=1)
    assert (d.finish_reason, d.num_tokens) == (FINISH_STOP, 3)


def test_stop_string_spanning_tokens_cuts_after_the_completing_token():
    checker = StopChecker(max_new_tokens=10, stop=["cd"], decode=decode)
    d = checker.check([0, 1, 2, 3, 4, 5], num_new=4)  # "abcdef"
    assert (d.finish_reason, d.num_tokens) == (FINISH_STOP, 4)
    assert checker.text_before_stop("abcd") == "ab"


def test_stop_string_before_eos_wins():
    checker = StopChecker(max_new_tokens=10, eos_token_ids=[25], stop=["b"], decode=decode)
    assert checker.check([0, 1, 25], num_new=3).num_tokens == 2


def test_stop_strings_need_a_decoder():
    with pytest.raises(ValueError, match="tokenizer"):
        StopChecker(max_new_tokens=3, stop=["x"])
