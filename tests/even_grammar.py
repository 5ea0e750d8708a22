"""A grammar matcher for pure tests: only even tokens may come; token 0 ends the grammar."""

from __future__ import annotations

import numpy as np

from specdec.sampling.grammar_matcher import GrammarMatcher


class EvenGrammar(GrammarMatcher):
    """Only even tokens; token 0 ends the grammar."""

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens = tokens or []

    def fill_mask(self, out: np.ndarray) -> None:
        out[:] = np.int32(0x55555555)  # bits 0, 2, 4, ... of every word

    def accept(self, token: int) -> bool:
        if token % 2 or self.ended:
            return False
        self.tokens.append(token)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.tokens[len(self.tokens) - num_tokens:]

    def fork(self) -> EvenGrammar:
        return EvenGrammar(list(self.tokens))

    @property
    def ended(self) -> bool:
        return bool(self.tokens) and self.tokens[-1] == 0
