"""A proposer's private copy of a row's grammar: the masks its drafts are proposed under.

The target's logits are masked by the row's grammar (`GrammarRow`); a draft that ignores it
keeps proposing tokens the mask forbids, which verification rejects with certainty. A
`GrammarCursor` is a fork of the row's matcher at the end of the row's history (`length`
tokens): the draft masks its logits at each drafted position by the state after the history
and its own drafts before that position, advancing the copy as it drafts. The row's matcher
never moves (the copy is dropped with the call: rolling back is free), and a copy may be
walked on any thread.

The fork is made when it is needed, not with the cursor: a cursor made `shared` reads the
row's matcher (which stays where it is for the whole proposal call: the engine moves it only
before and after) and forks it at the first token the cursor takes. So a proposer that only
reads the spec (a served draft's client) forks nothing, and one that drafts forks once per
row, not once for the request and again for its walk (docs/structured_output.md).

Exactness does not rest on the cursor: the draft reports the masked, renormalised q it drew
from, and the acceptance rule is exact for any q actually sampled from. Where the cursor
cannot follow (a history token or a drafted token the grammar forbids, the grammar ended), it
masks nothing more: what follows is cut before verification anyway.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specdec.sampling import grammar_mask
from specdec.sampling.grammar_matcher import Grammar, GrammarMatcher, allows, mask_width


class GrammarCursor:
    """A matcher of the proposer's own, after the first `length` tokens of the row's history,
    for logits of vocab_size tokens. spec: the grammar it follows, for a proposer that drafts
    elsewhere (a served draft worker compiles it again: its matcher cannot travel); None where
    no one needs it."""

    def __init__(self, matcher: GrammarMatcher, length: int, vocab_size: int, spec: Grammar | None = None,
                 shared: bool = False) -> None:
        """shared: `matcher` is its owner's (the row's), read as it is and forked at the first
        token this cursor takes; its owner must not move it while the cursor is in use."""
        self._matcher = matcher
        self._shared = shared
        self.length = length
        self.vocab_size = vocab_size
        self.spec = spec
        self._following = True  # False once it took a token the grammar forbids

    def at(self, history: list[int]) -> GrammarCursor | None:
        """A fresh copy advanced along history[length:] (what an ask adds to the row's history:
        a look-ahead's unverified drafts and its branch token); None (draft unmasked) when the
        history is shorter than the row's, or its added tokens leave the grammar. A shared
        cursor's copy shares the same matcher until it takes a token; an own one's is a fork."""
        if len(history) < self.length or not self._following:
            return None
        matcher = self._matcher if self._shared else self._matcher.fork()
        copy = GrammarCursor(matcher, self.length, self.vocab_size, self.spec, shared=self._shared)
        for token in history[self.length:]:
            if copy._matcher.ended or not copy._walked().accept(token):
                return None
            copy.length += 1
        return copy

    def _walked(self) -> GrammarMatcher:
        """The matcher to advance: a shared one is forked first (once)."""
        if self._shared:
            self._matcher, self._shared = self._matcher.fork(), False
        return self._matcher

    def allowed(self) -> np.ndarray | None:
        """The packed mask ([W] int32) of the tokens allowed next; None when there is none to
        apply (the grammar ended, or the cursor took a token it forbids)."""
        if not self._following or self._matcher.ended:
            return None
        out = np.zeros(mask_width(self.vocab_size), dtype=np.int32)  # [W]
        self._matcher.fill_mask(out)
        return out

    def accept(self, token: int) -> None:
        """The proposer drafted `token`: move past it (a token the grammar forbids ends the masks)."""
        if self._following and not self._matcher.ended:
            self._following = self._walked().accept(token)
        self.length += 1

    def masks_along(self, tokens: list[int]) -> list[np.ndarray | None]:
        """The mask before each of `tokens` and after the last (len(tokens) + 1 of them),
        advancing along them."""
        masks = []
        for token in tokens:
            masks.append(self.allowed())
            self.accept(token)
        return [*masks, self.allowed()]

    def allowed_prefix(self, tokens: list[int]) -> list[int]:
        """The leading tokens the grammar allows (up to its first forbidden one, or its end),
        advancing along them."""
        for i, token in enumerate(tokens):
            mask = self.allowed()
            if mask is None or not allows(mask, token):
                return tokens[:i]
            self.accept(token)
        return tokens


def mask_logits(logits: Tensor, masks: list[np.ndarray | None]) -> Tensor:
    """logits [a, V] with the tokens each row's packed mask ([W] int32) forbids at -inf (a new
    tensor; the same one when no row has a mask). A row without a mask, or whose mask would
    leave it no finite logit (a draft vocabulary without the allowed tokens), stays as it was:
    the draft then proposes freely, and its q is still what it drew from."""
    if all(mask is None for mask in masks):
        return logits
    width = mask_width(logits.shape[-1])
    words = np.full((len(masks), width), grammar_mask.ALL_ALLOWED, dtype=np.int32)  # [a, W]
    for k, mask in enumerate(masks):
        if mask is not None:
            words[k, : min(width, mask.shape[0])] = mask[:width]
    masked = grammar_mask.apply_masks(logits, torch.from_numpy(words))  # [a, V]
    dead = masked.amax(dim=-1) == float("-inf")  # [a]: rows the mask would leave nothing
    if bool(dead.any()):
        masked[dead] = logits[dead]
    return masked
