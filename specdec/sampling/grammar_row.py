"""One request's grammar during decoding, on the side that runs the rounds (the engine).

Before a round is verified, `constrain` walks the matcher through the row's drafted tokens:
it writes the mask of every position the target scores, and cuts the draft after its first
token the grammar forbids (that token stays: the target's masked distribution gives it
probability 0, so verification rejects it with certainty and draws the recovered token from
norm(max(0, p - q)) there, exactly as unconstrained verification of a masked p would; what
follows it could never be accepted). The matcher then rolls back what it walked through, and
`advance` moves it by the tokens the round emitted (accepted + recovered or bonus): the
masks always describe the history the target verifies against, retries included.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specdec.sampling.grammar_cursor import GrammarCursor
from specdec.sampling.grammar_matcher import Grammar, GrammarMatcher, allows, mask_width


class GrammarViolation(ValueError):
    """An emitted token the grammar does not allow (a broken mask): the row fails."""


class GrammarRow:
    """The matcher of one request's output, for logits of vocab_size tokens; spec: the
    grammar it was made of (its proposal cursors carry it to a served draft worker)."""

    def __init__(self, matcher: GrammarMatcher, vocab_size: int, spec: Grammar | None = None) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.spec = spec
        self.width = mask_width(vocab_size)

    @property
    def ended(self) -> bool:
        return self.matcher.ended

    def constrain(self, draft_ids: list[int]) -> tuple[int, Tensor]:
        """(how many drafted tokens to keep, masks [kept + 1, W] int32) for a round that
        verifies draft_ids after the row's history. The matcher ends where it started."""
        masks = np.zeros((len(draft_ids) + 1, self.width), dtype=np.int32)  # [n + 1, W]
        walked = kept = 0
        for i, token in enumerate(draft_ids):
            if self.matcher.ended:  # the draft ended the grammar: nothing follows (its row stops there)
                break
            self.matcher.fill_mask(masks[i])
            if not allows(masks[i], token) or not self.matcher.accept(token):
                kept = i + 1  # the forbidden token is verified (and surely rejected); nothing after it
                masks[kept] = masks[i]  # never used: the position after a token that is rejected
                break
            walked = kept = i + 1
        if kept == walked:  # no forbidden token: the position after the last drafted one
            if self.matcher.ended:
                masks[kept] = masks[kept - 1]  # never used: the row stops at the grammar's end
            else:
                self.matcher.fill_mask(masks[kept])
        self.matcher.rollback(walked)
        return kept, torch.from_numpy(masks[: kept + 1])

    def cursor(self, length: int) -> GrammarCursor:
        """The proposer's cursor (the matcher stays), at the end of the row's history of
        `length` tokens: where the matcher is between rounds. It forks the matcher only when
        it walks (`GrammarCursor`, shared): the engine moves the matcher only before and after
        the proposal call."""
        return GrammarCursor(self.matcher, length, self.vocab_size, self.spec, shared=True)

    def advance(self, emitted: list[int]) -> list[int]:
        """Move by the round's emitted tokens; returns them up to the grammar's end (the token
        that ended it included). GrammarViolation when one of them is not allowed."""
        for i, token in enumerate(emitted):
            if not self.matcher.accept(token):
                raise GrammarViolation(f"grammar: the emitted token {token} is not allowed by the grammar")
            if self.matcher.ended:
                return emitted[: i + 1]
        return emitted


def draft_cursor(row: GrammarRow | None, length: int) -> GrammarCursor | None:
    """The cursor a proposal request carries for a row with this grammar (None: no grammar)."""
    return None if row is None else row.cursor(length)
