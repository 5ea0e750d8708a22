"""ids -> text as every output is decoded (special tokens skipped), without the wrapper's
per-call work where it adds nothing.

The engine decodes a short window per emitted token (`IncrementalDetokenizer`), so the
tokenizer's `decode` runs a few times per token of every stream. For a fast (Rust-backed)
transformers tokenizer, `decode` converts its input, dispatches to `_decode`, which calls the
backend tokenizer's `decode` and, when `clean_up_tokenization_spaces` is set, edits the text;
the wrapper costs several times the backend's call. Where the tokenizer's class keeps
transformers' own `decode` and `_decode` and no clean-up is configured, the backend's result
is what the wrapper returns, and it is called directly; any other tokenizer goes through
its `decode`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# where transformers defines the fast tokenizers' `_decode` (v5, v4) and every tokenizer's `decode`
_FAST_DECODE_MODULES = ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast")
_BASE_DECODE_MODULE = "transformers.tokenization_utils_base"


def tokenizer_decode(tokenizer: Any) -> Callable[[list[int]], str]:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=True)``, through the backend directly
    where that returns the same text (`backend_decodes_alike`)."""
    if backend_decodes_alike(tokenizer):
        backend = tokenizer.backend_tokenizer
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def backend_decodes_alike(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode`` of a list of ids is its backend tokenizer's `decode`: a
    fast tokenizer whose class overrides neither `decode` nor `_decode`, without clean-up."""
    cls = type(tokenizer)
    return (getattr(tokenizer, "backend_tokenizer", None) is not None
            and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False
            and getattr(getattr(cls, "_decode", None), "__module__", None) in _FAST_DECODE_MODULES
            and getattr(getattr(cls, "decode", None), "__module__", None) == _BASE_DECODE_MODULE)
