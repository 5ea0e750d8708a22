"""The grammar interface the core enforces: one matcher type, whatever engine is behind it.

A `GrammarMatcher` follows one request's output token by token: it says which tokens may
come next (a packed bitmask, `specdec.sampling.grammar_mask`), accepts a token, rolls back
tokens it accepted, forks an independent copy of itself, and says when the grammar has
ended. A `GrammarBackend` compiles a grammar (a `Grammar`:
specdec.requests.grammar_spec.GrammarSpec is one; once per distinct grammar: compiling a
JSON schema costs far more than a round) and makes matchers of it.
xgrammar is the one backend (`specdec.sampling.grammar_xgrammar`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import numpy as np


class Grammar(Protocol):
    """What a grammar is to the backend: its kind ("json_object", "json_schema", "regex",
    "ebnf") and its text (specdec.requests.grammar_spec.GrammarSpec)."""

    kind: str
    text: str


class GrammarError(ValueError):
    """A grammar that does not compile (bad input: `param` names the field)."""

    def __init__(self, message: str, param: str = "grammar.text") -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.reason = message


class GrammarMatcher(ABC):
    """One request's position in its grammar."""

    @abstractmethod
    def fill_mask(self, out: np.ndarray) -> None:
        """Write the tokens allowed next into out ([W] int32, W = mask_width(vocab)): bit j
        of word i set = token 32 * i + j allowed. End-of-sequence ids only where the grammar
        may end."""

    @abstractmethod
    def accept(self, token: int) -> bool:
        """Advance by one token; False (and no change) when the grammar does not allow it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens."""

    @abstractmethod
    def fork(self) -> "GrammarMatcher":
        """An independent matcher at the same position (a draft walks its copy; this one stays)."""

    @property
    @abstractmethod
    def ended(self) -> bool:
        """The grammar has ended (it accepted an end-of-sequence token): nothing may follow."""


class GrammarBackend(ABC):
    """Compiles grammars for one tokenizer and vocabulary."""

    @abstractmethod
    def check(self, spec: Grammar) -> None:
        """Raise GrammarError when the grammar does not compile."""

    @abstractmethod
    def matcher(self, spec: Grammar, vocab_size: int) -> GrammarMatcher:
        """A fresh matcher at the start of the grammar, for logits of vocab_size tokens
        (compiled once per distinct grammar; GrammarError when it does not compile)."""


def mask_width(vocab_size: int) -> int:
    """How many int32 words hold one bit per token."""
    return (vocab_size + 31) // 32


def allows(mask: np.ndarray, token: int) -> bool:
    """Whether the packed mask ([W] int32) allows `token`."""
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)
