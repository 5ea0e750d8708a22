"""The Proposer interface: who guesses the next γ tokens of each sequence."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specdec.proposers.drafts import Drafts, EncodedQ
from specdec.sampling.grammar_cursor import GrammarCursor
from specdec.sampling.sampling_params import SamplingParams


@dataclass
class ProposalRequest:
    """One sequence asking for drafted tokens.

    token_ids: the sequence's full history (prompt + generated). The last token is the
        *pending* token: emitted, but not yet fed to the target. Histories only grow; a
        proposer with state rolls itself back to what the history confirms.
    sampling: the request's sampling parameters (its seed keys the draft's random draws).
    gamma: γ for this row: draft at most this many tokens (rows of one call differ).
    num_prompt_tokens: how many leading history tokens are the prompt (the draft's
        frequency and presence penalties count only the tokens after them).
    reserve_tokens: the most tokens the sequence may hold (prompt + max_new_tokens): a draft
        model reserves that much cache when it first sees the sequence and drafts no further
        (None: max_seq_len).
    grammar: the row's grammar (structured output) as a copy of its own, at the end of the
        row's history: a proposer drafts under the same mask as the target
        (docs/structured_output.md). None: no grammar, or a proposer that cannot follow it.
    """

    seq_id: str
    token_ids: list[int]
    sampling: SamplingParams
    proposer: str | None = None  # which proposer the request asked for (None = the server's)
    gamma: int = 1
    num_prompt_tokens: int = 0
    reserve_tokens: int | None = None
    grammar: GrammarCursor | None = None


#: a proposer's answer: one Drafts per request, in order
Proposal = list[Drafts]


@dataclass
class Branch:
    """Drafts made ahead for the round after the one being verified, valid for one verdict.

    The verdict this branch assumes: the history keeps its first `base_length` tokens (the
    round's history plus the drafts it accepts) and then emits `token_id` (the round's
    recovered or bonus token). `token_ids` continue exactly that history: the next round's
    drafts, with the q they were drawn from (`probs`: as Drafts.q).
    """

    base_length: int
    token_id: int
    token_ids: list[int]
    probs: torch.Tensor | EncodedQ | None = None

    def drafts(self) -> Drafts:
        """The next round's drafts this branch holds."""
        return Drafts(self.token_ids, self.probs)


class Proposer(ABC):
    """Guesses up to γ tokens per sequence from its history."""

    #: True when proposals carry draft probabilities (needed for sampled verification).
    has_probs: bool = False
    #: the proposer names a request may ask for here (ProposalRequest.proposer)
    names: tuple[str, ...] = ()
    #: why this proposer cannot draft right now (a remote draft worker is down), or None
    unavailable_reason: str | None = None

    def unavailable(self, name: str | None) -> str | None:
        """Why the proposer a request names (None = the default) cannot draft now, or None."""
        return self.unavailable_reason

    @abstractmethod
    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        """Draft up to each request's own γ tokens (one batched call per round): one
        Drafts per request, in order."""

    def look_ahead(self, requests: list[ProposalRequest], unverified: list[int],
                   branches: int = 1) -> list[list[Branch]]:
        """Draft the next round while this one is verified (pipelined rounds).

        Each request's token_ids are the round's history followed by its `unverified[i]`
        drafts, and its gamma is the next round's γ. Returns, per request, up to `branches`
        branches for the verdicts worth guessing. Here: one branch, the verdict that accepts
        every draft and whose bonus token is the proposer's own next guess (drafted γ + 1
        ahead); proposers that can tell how likely each verdict is branch on more."""
        proposal = self.propose([dataclasses.replace(r, gamma=r.gamma + 1) for r in requests])
        found = []
        for request, drafts in zip(requests, proposal):
            ids, q = drafts.token_ids, drafts.q
            found.append([Branch(len(request.token_ids), ids[0], ids[1:], None if q is None else q[1:])]
                         if len(ids) > 1 else [])
        return found

    def release(self, seq_id: str) -> None:  # noqa: B027 (optional hook: a no-op unless a proposer holds state)
        """The sequence finished (or was cancelled): free whatever is held for it."""


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share (list comparison runs at C speed; the
    per-token loop only covers the last chunk, where they differ)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 64:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    for i in range(lo, hi):
        if a[i] != b[i]:
            return i
    return hi
