"""A sequence ends at max_new_tokens, at EOS, or at a stop string; a round's extra tokens are cut.
The text handed out round by round is stable, never shows part of a stop string, and adds up to
decode(kept ids) cut before the stop string. Each round costs the same however long the output is."""

import random

import pytest

from specdec.requests.stop_conditions import FINISH_LENGTH, FINISH_STOP, StopChecker, StopDecision

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def letters(ids):
    """Toy decoder: token i is the i-th letter."""
    return "".join(LETTERS[i] for i in ids)


def ids_of(text):
    return [LETTERS.index(c) for c in text]


def run_rounds(checker, rounds):
    """Append each round; return the decisions (stopping at the first finished one)."""
    decisions = []
    for new_ids in rounds:
        decisions.append(checker.append(new_ids))
        if decisions[-1].finish_reason is not None:
            break
    return decisions


# ---- where the output ends ----------------------------------------------------------------------


def test_keeps_going_below_the_budget():
    checker = StopChecker(max_new_tokens=10)
    assert checker.append([1, 2, 3]) == StopDecision(None, 3, "")
    assert checker.num_tokens == 3


def test_cuts_a_round_that_overshoots_max_new_tokens():
    checker = StopChecker(max_new_tokens=4)
    checker.append([1])
    d = checker.append([2, 3, 4, 5, 6])
    assert (d.finish_reason, d.num_kept, checker.num_tokens) == (FINISH_LENGTH, 3, 4)


def test_eos_ends_the_sequence_and_is_kept():
    checker = StopChecker(max_new_tokens=10, eos_token_ids=[0])
    checker.append([1])
    d = checker.append([2, 0, 5])
    assert (d.finish_reason, d.num_kept, checker.num_tokens) == (FINISH_STOP, 2, 3)


def test_eos_on_the_last_allowed_token_reports_stop():
    checker = StopChecker(max_new_tokens=3, eos_token_ids=[0])
    checker.append([1, 2])
    assert checker.append([0]).finish_reason == FINISH_STOP


def test_stop_string_spanning_tokens_cuts_after_the_completing_token():
    checker = StopChecker(max_new_tokens=10, stop=["cd"], decode=letters)
    d = checker.append(ids_of("abcdef"))
    assert d == StopDecision(FINISH_STOP, 4, "ab")  # a, b, c, d kept; text cut before "cd"
    assert (checker.text, checker.num_tokens) == ("ab", 4)


def test_stop_string_spanning_rounds_cuts_in_the_later_round():
    checker = StopChecker(max_new_tokens=10, stop=["cd"], decode=letters)
    assert checker.append(ids_of("abc")) == StopDecision(None, 3, "ab")  # "c" may begin "cd"
    assert checker.append(ids_of("def")) == StopDecision(FINISH_STOP, 1, "")
    assert (checker.text, checker.num_tokens) == ("ab", 4)


def test_stop_string_before_eos_wins():
    checker = StopChecker(max_new_tokens=10, eos_token_ids=[25], stop=["b"], decode=letters)
    assert checker.append([0, 1, 25]).num_kept == 2


def test_stop_string_completed_by_the_eos_token_reports_the_stop_cut():
    checker = StopChecker(max_new_tokens=10, eos_token_ids=[25], stop=["bz"], decode=letters)
    assert checker.append(ids_of("abzq")) == StopDecision(FINISH_STOP, 3, "a")


def test_stop_string_completed_by_the_last_allowed_token_reports_stop():
    checker = StopChecker(max_new_tokens=3, stop=["bc"], decode=letters)
    assert checker.append(ids_of("abcd")) == StopDecision(FINISH_STOP, 3, "a")


def test_the_earliest_completed_stop_string_wins():
    checker = StopChecker(max_new_tokens=20, stop=["def", "bcd"], decode=letters)
    assert checker.append(ids_of("abcdefg")) == StopDecision(FINISH_STOP, 4, "a")


def test_stop_strings_completed_by_the_same_token_cut_at_the_earliest_start():
    checker = StopChecker(max_new_tokens=20, stop=["cd", "bcd"], decode=letters)
    assert checker.append(ids_of("abcdx")) == StopDecision(FINISH_STOP, 4, "a")


def test_append_after_finishing_is_an_error():
    checker = StopChecker(max_new_tokens=1)
    checker.append([3])
    with pytest.raises(RuntimeError):
        checker.append([4])


def test_stop_strings_need_a_decoder():
    with pytest.raises(ValueError, match="tokenizer"):
        StopChecker(max_new_tokens=3, stop=["x"])


def test_without_a_decoder_there_is_no_text():
    checker = StopChecker(max_new_tokens=3, eos_token_ids=[9])
    assert checker.append([1, 2]) == StopDecision(None, 2, "")
    assert checker.append([9]) == StopDecision(FINISH_STOP, 1, "")
    assert checker.text == ""


# ---- streaming text: stable, never a part of a stop string ---------------------------------------


def test_text_that_could_grow_into_a_stop_string_is_held_back():
    checker = StopChecker(max_new_tokens=20, stop=["cde"], decode=letters)
    texts = [d.text for d in run_rounds(checker, [ids_of("abc"), ids_of("d"), ids_of("x"), ids_of("c")])]
    assert texts == ["ab", "", "cdx", ""]  # "c", then "cd" held; released once "cdx" can't match
    assert checker.text == "abcdx"


def test_held_back_text_is_released_when_the_sequence_ends_otherwise():
    checker = StopChecker(max_new_tokens=3, stop=["cd"], decode=letters)
    assert checker.append(ids_of("abc")) == StopDecision(FINISH_LENGTH, 3, "abc")


def test_only_the_suffix_that_begins_a_stop_string_is_held():
    checker = StopChecker(max_new_tokens=20, stop=["abab", "bx"], decode=letters)
    assert checker.append(ids_of("aaba")).text == "a"  # "aba" could become "abab"
    assert checker.append(ids_of("c")).text == "abac"


def test_a_character_split_across_tokens_is_released_when_complete():
    byte_decode = lambda ids: bytes(ids).decode(errors="replace")  # noqa: E731  (token id == byte)
    checker = StopChecker(max_new_tokens=20, stop=["!!"], decode=byte_decode)
    emoji = list("😀".encode())  # 4 tokens
    assert [checker.append([i]).text for i in [ord("a")] + emoji] == ["a", "", "", "", "😀"]


def test_a_stop_string_is_found_even_if_its_last_token_begins_a_partial_character():
    vocab = [b"a", b"b\xe4", b"\xb8\x96", b"c"]  # token 1 = "b" + the first byte of 世
    decode = lambda ids: b"".join(vocab[i] for i in ids).decode(errors="replace")  # noqa: E731
    checker = StopChecker(max_new_tokens=20, stop=["ab"], decode=decode)
    assert checker.append([0, 1, 2, 3]) == StopDecision(FINISH_STOP, 2, "")


# ---- cost per round: independent of the output length --------------------------------------------


class CountingDecode:
    """Wraps a decode function and counts the ids it was given."""

    def __init__(self, decode):
        self.decode, self.ids_decoded = decode, 0

    def __call__(self, ids):
        self.ids_decoded += len(ids)
        return self.decode(ids)


def test_decoding_per_round_does_not_grow_with_the_output():
    counting = CountingDecode(letters)
    checker = StopChecker(max_new_tokens=10_000, stop=["zzz", "qq", "abcdefgh"], decode=counting)
    rng = random.Random(0)
    per_round = []
    for _ in range(1000):  # 4,000 tokens, 4 a round, none of them q or z
        before = counting.ids_decoded
        assert checker.append([rng.randrange(16) for _ in range(4)]).finish_reason is None
        per_round.append(counting.ids_decoded - before)
    assert max(per_round) <= 4 * 4  # a few ids per token, never the whole output
    assert checker.num_tokens == 4000 and len(checker.text) >= 4000 - 7


def test_many_stop_strings_on_a_long_output():
    """150,000 stop strings: each round looks up only substrings of the new text's neighbourhood."""
    rng = random.Random(1)
    # a..t only: none of them can match the x/y/z output, except the last one
    stops = ["".join(rng.choice(LETTERS[:20]) for _ in range(rng.randrange(4, 12))) for _ in range(150_000)]
    stops.append("xyx")
    checker = StopChecker(max_new_tokens=100_000, stop=stops, decode=letters)
    ids = [rng.choice([23, 24, 25]) for _ in range(3000)]  # x, y, z only: matches just "xyx"
    decisions = run_rounds(checker, [ids[i : i + 5] for i in range(0, len(ids), 5)])
    expected = letters(ids).find("xyx")
    assert decisions[-1].finish_reason == FINISH_STOP
    assert checker.num_tokens == expected + 3 and checker.text == letters(ids)[:expected]


# ---- the real bundled tokenizer: streaming == final text == decode cut before the stop -----------

ALPHABET = "abc xyz\n(){}=.é世界😀🎉ñ—’…"  # " \xe2\x80" is one token: " " + a partial "—"


def reference(ids, max_new_tokens, eos, stops, decode):
    """The specification, by brute force: (tokens kept, finish reason, final text)."""
    for n in range(1, len(ids) + 1):
        text = decode(ids[:n])
        starts = [text.find(s) for s in stops if s in text]
        if starts:
            return n, FINISH_STOP, text[: min(starts)]
        if ids[n - 1] in eos:
            return n, FINISH_STOP, text
        if n >= max_new_tokens:
            return n, FINISH_LENGTH, text
    return len(ids), None, decode(ids)


def random_case(rng, tokenizer):
    """Random text of multi-byte characters, stop strings (mostly taken from it), random rounds."""
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(20, 120)))
    ids = tokenizer.encode(text, add_special_tokens=False)
    stops = []
    for _ in range(rng.randrange(0, 4)):
        start = rng.randrange(len(text))
        stops.append(text[start : start + rng.randrange(1, 5)] if rng.random() < 0.7 else "zz😀")
    eos = [rng.choice(ids)] if rng.random() < 0.2 else []
    max_new_tokens = rng.choice([len(ids) + 5, rng.randrange(1, len(ids) + 1)])
    rounds, i = [], 0
    while i < len(ids):
        size = rng.randrange(1, 6)
        rounds.append(ids[i : i + size])
        i += size
    return ids, rounds, max_new_tokens, eos, stops


@pytest.mark.parametrize("text, stop", [("a —b", "a "), ("say “hi” now", "y "), ("é … ok", "é ")])
def test_stop_string_ending_inside_a_token_with_a_partial_character(tokenizer, text, stop):
    """' \xe2\x80' is one token (a space + 2 of the 3 bytes of '—', '…', '“'): the stop string is
    complete on that token, though the text then ends in a partial character."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids = tokenizer.encode(text, add_special_tokens=False)
    kept, _, final_text = reference(ids, 100, [], [stop], decode)
    checker = StopChecker(100, (), [stop], decode)
    assert checker.append(ids) == StopDecision(FINISH_STOP, kept, final_text)
    assert final_text == text[: text.index(stop)] and kept < len(ids)


@pytest.mark.parametrize("seed", range(200))
def test_random_texts_with_the_bundled_tokenizer(tokenizer, seed):
    rng = random.Random(seed)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids, rounds, max_new_tokens, eos, stops = random_case(rng, tokenizer)
    kept, reason, final_text = reference(ids, max_new_tokens, eos, stops, decode)
    checker = StopChecker(max_new_tokens, eos, stops, decode)
    decisions = run_rounds(checker, rounds)
    streamed = ""
    for d in decisions:
        streamed += d.text
        assert final_text.startswith(streamed)  # no part of a stop string ever leaks out
        if d.finish_reason is None:
            assert "\ufffd" not in d.text  # never a partial character while unfinished
    assert (checker.num_tokens, decisions[-1].finish_reason) == (kept, reason)
    assert sum(d.num_kept for d in decisions) == kept
    assert streamed == checker.text == final_text
