"""A proposer's copy of a row's grammar: it follows the ask's tokens past the row's history and
the proposer's own drafts, masks logits by the state it reached, and never moves the row's
matcher; where it cannot follow (a forbidden token) it masks nothing more. It forks the row's
matcher only once it takes a token: a proposer that reads only its spec forks nothing, one
that drafts forks once."""

from __future__ import annotations

import numpy as np
import torch

from even_grammar import EvenGrammar
from specdec.sampling.grammar_cursor import GrammarCursor, mask_logits
from specdec.sampling.grammar_row import GrammarRow, draft_cursor

VOCAB = 40


def allowed_set(mask: np.ndarray | None) -> set[int] | None:
    if mask is None:
        return None
    return {t for t in range(VOCAB) if (int(mask[t >> 5]) >> (t & 31)) & 1}


def test_a_cursor_walks_a_copy_and_the_rows_matcher_stays_where_it_was():
    row = GrammarRow(EvenGrammar([2, 4]), VOCAB)
    cursor = row.cursor(length=7)  # 5 prompt tokens + the 2 output tokens the row's matcher took
    walked = cursor.at([9, 9, 9, 9, 9, 2, 4, 6, 8])  # the ask adds 6, 8 (a look-ahead's drafts)
    assert walked is not None and walked.length == 9
    walked.accept(10)
    assert row.matcher.tokens == [2, 4] and cursor.at([9] * 5 + [2, 4]) is not None
    assert allowed_set(walked.allowed()) == set(range(0, VOCAB, 2))


def test_a_cursor_masks_nothing_once_it_cannot_follow_the_grammar():
    cursor = GrammarCursor(EvenGrammar(), 0, VOCAB)
    assert cursor.at([2, 3]) is None, "the ask's history leaves the grammar"
    assert cursor.at([]) is not None and cursor.at([0, 2]) is None, "nothing follows the grammar's end"
    drafting = cursor.at([2])
    drafting.accept(5)  # a draft the mask did not cover (e.g. a draft vocabulary without the allowed tokens)
    assert drafting.allowed() is None
    ended = cursor.at([0])
    assert ended.allowed() is None
    assert draft_cursor(None, 3) is None


def test_masks_along_and_allowed_prefix_follow_the_tokens():
    cursor = GrammarCursor(EvenGrammar(), 0, VOCAB)
    masks = cursor.at([]).masks_along([2, 4])
    assert len(masks) == 3 and all(allowed_set(m) == set(range(0, VOCAB, 2)) for m in masks)
    assert cursor.at([]).allowed_prefix([2, 4, 7, 8]) == [2, 4]
    assert cursor.at([]).allowed_prefix([2, 0, 8]) == [2, 0], "nothing follows the grammar's end"


def test_mask_logits_forbids_what_each_rows_mask_forbids_and_leaves_other_rows_alone():
    logits = torch.randn(3, VOCAB)
    even = GrammarCursor(EvenGrammar(), 0, VOCAB).allowed()
    dead = logits.clone()
    dead[1, ::2] = float("-inf")  # row 1 has no finite logit on an allowed token
    out = mask_logits(dead, [even, even, None])
    assert torch.equal(out[0, ::2], dead[0, ::2]) and bool(torch.isinf(out[0, 1::2]).all())
    assert torch.equal(out[1], dead[1]), "a mask that would leave nothing is not applied"
    assert torch.equal(out[2], dead[2])
    assert mask_logits(logits, [None, None, None]) is logits


class CountedForks(EvenGrammar):
    """EvenGrammar counting the forks made of it and of its forks."""

    def __init__(self, tokens=None, forks=None) -> None:
        super().__init__(tokens)
        self.forks = forks if forks is not None else [0]

    def fork(self) -> "CountedForks":
        self.forks[0] += 1
        return CountedForks(list(self.tokens), self.forks)


def test_a_cursor_forks_the_rows_matcher_only_when_it_takes_a_token():
    matcher = CountedForks([2, 4])
    row = GrammarRow(matcher, VOCAB)
    cursor = draft_cursor(row, 7)
    assert matcher.forks == [0], "a cursor whose spec is all that is read (a served draft's client) forks nothing"
    walking = cursor.at([9] * 5 + [2, 4])  # the round's ask: nothing past the row's history
    assert allowed_set(walking.allowed()) == set(range(0, VOCAB, 2)) and matcher.forks == [0]
    for token in (6, 8, 10):  # the draft walks its copy: one fork, at its first token
        walking.accept(token)
    assert matcher.forks == [1] and row.matcher.tokens == [2, 4]
    ahead = cursor.at([9] * 5 + [2, 4, 6, 8])  # a look-ahead's copy past the round's drafts
    ahead.masks_along([10, 12])
    assert matcher.forks == [2] and row.matcher.tokens == [2, 4] and ahead.length == 11
    assert cursor.at([9] * 5 + [2, 4]).allowed_prefix([6, 7]) == [6] and row.matcher.tokens == [2, 4]
