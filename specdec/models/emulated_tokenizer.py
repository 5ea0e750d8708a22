"""The tokenizer of emulated models: the bundled byte-level BPE cut to the first vocab_size tokens.

Keeping the tokens with ids below vocab_size and the merges that build them gives a real
tokenizer of that vocabulary: every byte is a token (ids 1-256), so any text encodes and
decodes exactly, and id 0 is end-of-text. Text prompts, the chat template, stop strings
and the incremental detokenizer work as with the bundled pair.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from specdec.models.model_paths import BUNDLED_DIR

_BYTE_LEVEL_TOKENS = 257  # end-of-text and the 256 bytes


@functools.lru_cache(maxsize=8)
def emulated_tokenizer(vocab_size: int) -> Any:
    """A transformers tokenizer over ids [0, vocab_size) (vocab_size >= 257)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if vocab_size < _BYTE_LEVEL_TOKENS:
        raise ValueError(f"vocab_size={vocab_size} must be >= {_BYTE_LEVEL_TOKENS} (every byte is a token)")
    spec = json.loads((BUNDLED_DIR / "target" / "tokenizer.json").read_text())
    model = spec["model"]
    vocab = {token: i for token, i in model["vocab"].items() if i < vocab_size}
    if len(vocab) < vocab_size:
        raise ValueError(f"vocab_size={vocab_size} exceeds the bundled tokenizer's {len(model['vocab'])} tokens")
    model["vocab"] = vocab
    model["merges"] = [pair for pair in model["merges"] if "".join(pair) in vocab]
    settings = json.loads((BUNDLED_DIR / "target" / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                        eos_token=settings["eos_token"], pad_token=settings["pad_token"])
    tokenizer.chat_template = settings["chat_template"]
    return tokenizer


@functools.lru_cache(maxsize=8)
def readable_ids(vocab_size: int) -> tuple[int, ...]:
    """Ids whose text alone is whole, printable characters (spaces, newlines and tabs too): the
    tokens an emulated model generates, so that its text reads as text (no lone UTF-8 bytes,
    no control characters). End-of-text (id 0) is not among them."""
    tokenizer = emulated_tokenizer(vocab_size)
    readable = []
    for i in range(1, vocab_size):
        text = tokenizer.decode([i])
        if text and "\ufffd" not in text and all(ch.isprintable() or ch in "\n\t" for ch in text):
            readable.append(i)
    return tuple(readable)
