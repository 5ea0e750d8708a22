"""IncrementalDetokenizer: pushing tokens one at a time, then flush(), gives exactly decode(all ids);
text is held back only while it may end in a partial character; each push decodes a bounded window."""

import random

import pytest

from specdec.requests.detokenizer import MAX_HELD, MAX_PENDING, IncrementalDetokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SAMPLE_TEXTS = [
    "héllo wörld, ça va? naïve café",
    "def f(x):\n    return x  # 😀 done 🎉🎉",
    "世界你好, こんにちは, 안녕하세요",
    "mixed: é😀世 a\u0301 🇫🇷 👩‍👩‍👧 end",
    "ascii only: for i in range(10): print(i)",
]


def letters(ids):
    return "".join(LETTERS[i] for i in ids)


def byte_decoder(vocab: list[bytes]):
    """A toy byte-level tokenizer: token i is the bytes vocab[i]; invalid UTF-8 -> U+FFFD."""
    return lambda ids: b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


SINGLE_BYTES = [bytes([b]) for b in range(256)]  # token id == byte value


class CountingDecode:
    """Wraps a decode function and records the length of every list it was given."""

    def __init__(self, decode):
        self.decode = decode
        self.lengths: list[int] = []

    def __call__(self, ids):
        self.lengths.append(len(ids))
        return self.decode(ids)


def stream(decode, ids) -> list[str]:
    """Push ids one at a time; return each push's text, then flush()'s."""
    detok = IncrementalDetokenizer(decode)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert detok.text == "".join(pieces)
    return pieces


# ---- toy decoders: what is returned when -------------------------------------------------------


def test_each_whole_character_token_is_returned_at_once():
    assert stream(letters, [7, 4, 11, 11, 14]) == ["h", "e", "l", "l", "o", ""]


def test_a_character_split_across_tokens_is_returned_when_complete():
    ids = list("a😀b".encode())  # 'a', 4 bytes of the emoji, 'b'
    assert stream(byte_decoder(SINGLE_BYTES), ids) == ["a", "", "", "", "😀", "b", ""]


def test_flush_returns_an_incomplete_trailing_character_as_decoded():
    ids = list("x世".encode())[:-1]  # the last byte of 世 never arrives
    assert stream(byte_decoder(SINGLE_BYTES), ids) == ["x", "", "", "\ufffd"]


def test_invalid_bytes_followed_by_more_invalid_bytes_are_returned_exactly():
    decode = byte_decoder(SINGLE_BYTES)
    ids = [0x80, 0xFF, 0xC3, 0xE4, 0xB8, 0x41] * 10 + [0xF0, 0x9F]  # stays ending in U+FFFD
    assert "".join(stream(decode, ids)) == decode(ids)


def test_empty_sequence_flushes_nothing():
    detok = IncrementalDetokenizer(letters)
    assert (detok.flush(), detok.text) == ("", "")


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_stream_to_exactly_the_decoded_text(seed):
    rng = random.Random(seed)
    ids = [rng.choice([rng.randrange(256), rng.randrange(0x80, 0x100)]) for _ in range(300)]
    decode = byte_decoder(SINGLE_BYTES)
    assert "".join(stream(decode, ids)) == decode(ids)


# ---- the real bundled tokenizer (byte-level BPE, 4,096 tokens) -----------------------------------


@pytest.fixture(scope="module")
def decode(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_multibyte_text_streams_to_exactly_the_decoded_text(tokenizer, decode, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = stream(decode, ids)
    assert "".join(pieces) == decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)  # never a partial character


@pytest.mark.parametrize("seed", range(5))
def test_random_token_ids_stream_to_exactly_the_decoded_text(tokenizer, decode, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(len(tokenizer)) for _ in range(1000)]
    assert "".join(stream(decode, ids)) == decode(ids)


@pytest.mark.parametrize("seed", range(5))
def test_token_ids_rich_in_partial_characters_stream_exactly(tokenizer, decode, seed):
    """Half the ids are tokens whose bytes are not valid UTF-8 on their own (single bytes >= 0x80)."""
    partial = [i for i in range(len(tokenizer)) if "\ufffd" in decode([i])]
    rng = random.Random(seed)
    ids = [rng.choice(partial) if rng.random() < 0.5 else rng.randrange(len(tokenizer)) for _ in range(1000)]
    assert "".join(stream(decode, ids)) == decode(ids)


# ---- cost: each push decodes a bounded window, never the whole history --------------------------


def test_each_push_decodes_a_bounded_window(tokenizer, decode):
    rng = random.Random(0)
    text_ids = tokenizer.encode(" ".join(SAMPLE_TEXTS), add_special_tokens=False)
    # shuffled text tokens: many characters split across tokens, and invalid byte sequences
    ids = [rng.choice(text_ids) if rng.random() < 0.7 else rng.randrange(1, len(tokenizer)) for _ in range(2000)]
    counting = CountingDecode(decode)
    detok = IncrementalDetokenizer(counting)
    for i in ids:
        detok.push(i)
    # window = the last returned chunk + the held tokens, each at most MAX_PENDING + 1 with this
    # vocabulary (no token straddles two characters, so a final boundary is found among them)
    assert max(counting.lengths) <= 2 * (MAX_PENDING + 1) == 10
    assert len(counting.lengths) <= 3 * len(ids)  # about two decode calls per push


def test_the_window_stays_bounded_even_when_no_boundary_is_ever_final():
    """Tokens that straddle characters (end of one emoji + start of the next) keep the text ending
    in U+FFFD forever; the window is still cut at MAX_HELD tokens (exactness is given up there)."""
    vocab = [b"\x80\xf0", b"\x9f", b"\x98"]
    counting = CountingDecode(byte_decoder(vocab))
    detok = IncrementalDetokenizer(counting)
    for i in [0, 1, 2] * 700:
        detok.push(i)
    assert max(counting.lengths) <= 2 * MAX_HELD + 2
