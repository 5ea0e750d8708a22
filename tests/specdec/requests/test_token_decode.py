"""ids -> text through the backend tokenizer only where transformers' decode returns the same."""

import random

import pytest
from transformers import AutoTokenizer

from specdec.models.emulated_tokenizer import emulated_tokenizer
from specdec.models.model_paths import BUNDLED_DIR
from specdec.requests.token_decode import backend_decodes_alike, tokenizer_decode


def _windows(vocab_size: int, special: list[int]) -> list[list[int]]:
    """Short and long windows of random ids (lone UTF-8 bytes, special tokens among them)."""
    rng = random.Random(7)
    ids = list(range(vocab_size)) + special * 50
    return [[rng.choice(ids) for _ in range(rng.choice([1, 2, 3, 5, 40]))] for _ in range(3000)]


@pytest.mark.parametrize("tokenizer", [emulated_tokenizer(512), AutoTokenizer.from_pretrained(BUNDLED_DIR / "target")],
                         ids=["emulated", "bundled"])
def test_the_backend_path_decodes_every_window_as_the_tokenizer_does(tokenizer):
    assert backend_decodes_alike(tokenizer)
    decode = tokenizer_decode(tokenizer)
    for window in _windows(len(tokenizer), tokenizer.all_special_ids):
        assert decode(window) == tokenizer.decode(window, skip_special_tokens=True), window


def test_a_tokenizer_with_clean_up_or_its_own_decode_goes_through_its_decode():
    cleaning = AutoTokenizer.from_pretrained(BUNDLED_DIR / "target", clean_up_tokenization_spaces=True)
    assert not backend_decodes_alike(cleaning)

    class Shouting(type(cleaning)):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    shouting = Shouting.from_pretrained(BUNDLED_DIR / "target")
    assert not shouting.clean_up_tokenization_spaces and not backend_decodes_alike(shouting)
    ids = shouting.encode("a quiet line")
    assert tokenizer_decode(shouting)(ids) == "A QUIET LINE"


def test_anything_else_with_a_decode_is_called_as_it_is():
    class Plain:
        def decode(self, ids, skip_special_tokens=False):
            return f"{ids}:{skip_special_tokens}"

    assert tokenizer_decode(Plain())([1, 2]) == "[1, 2]:True"
