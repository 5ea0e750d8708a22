"""The Proposer interface: who guesses the next γ tokens of each sequence."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specdec.sampling_params import SamplingParams


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
    """

    seq_id: str
    token_ids: list[int]
    sampling: SamplingParams
    proposer: str | None = None  # which proposer the request asked for (None = the server's)
    gamma: int = 1
    num_prompt_tokens: int = 0


@dataclass
class Proposal:
    """Drafted tokens for a batch.

    token_ids: [batch, gamma] int64, gamma = the call's largest γ; entries past
        num_drafted[b] are -1.
    num_drafted: [batch] int64, each at most row b's own γ.
    probs: [batch, gamma, vocab] draft distribution q the tokens were sampled from, as
        weights (specdec.sampling.normalize_probs gives q), or None for proposers without
        probabilities (verified as a one-hot q).
    """

    token_ids: torch.Tensor
    num_drafted: torch.Tensor
    probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        assert self.token_ids.dim() == 2, f"token_ids must be [batch, gamma], got {tuple(self.token_ids.shape)}"
        assert self.num_drafted.shape == (self.token_ids.shape[0],), "num_drafted must be [batch]"
        if self.probs is not None:
            assert self.probs.shape[:2] == self.token_ids.shape, "probs must be [batch, gamma, vocab]"

    @classmethod
    def empty(cls, batch_size: int, gamma: int = 0) -> "Proposal":
        return cls(
            token_ids=torch.full((batch_size, gamma), -1, dtype=torch.long),
            num_drafted=torch.zeros(batch_size, dtype=torch.long),
        )

    @classmethod
    def from_rows(cls, rows: list[tuple[list[int], torch.Tensor | None]], width: int) -> "Proposal":
        """A proposal from per-row (drafted ids, q weights [n, vocab] or None); rows without
        q get a one-hot q when others have one."""
        proposal = cls.empty(len(rows), width)
        with_probs = {}
        for i, (ids, probs) in enumerate(rows):
            proposal.token_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            proposal.num_drafted[i] = len(ids)
            if probs is not None:
                with_probs[i] = probs
        if with_probs:
            proposal.set_probs(with_probs, next(iter(with_probs.values())).shape[-1])
        return proposal

    def spread(self, rows: list[bool]) -> "Proposal":
        """This proposal (one row per True entry) spread out to all rows; the others draft nothing."""
        index = [i for i, used in enumerate(rows) if used]
        full = Proposal.empty(len(rows), self.token_ids.shape[1])
        full.token_ids[index] = self.token_ids
        full.num_drafted[index] = self.num_drafted
        if self.probs is not None:
            full.probs = self.probs.new_zeros(len(rows), *self.probs.shape[1:])
            full.probs[index] = self.probs
        return full

    def set_probs(self, rows: dict[int, torch.Tensor], vocab_size: int) -> None:
        """q for every row: the given [num_drafted, vocab] weights for `rows`, a one-hot q
        over the drafted tokens for the others (never a zero q, which would accept anything)."""
        batch, gamma = self.token_ids.shape
        self.probs = torch.zeros(batch, gamma, vocab_size)  # [batch, gamma, vocab]
        for i in range(batch):
            n = int(self.num_drafted[i])
            if i in rows:
                self.probs[i, :n] = rows[i]
            else:
                self.probs[i, torch.arange(n), self.token_ids[i, :n]] = 1.0

    def drafted(self, row: int) -> list[int]:
        """The drafted tokens of one row, without padding."""
        return self.token_ids[row, : int(self.num_drafted[row])].tolist()


@dataclass
class Branch:
    """Drafts made ahead for the round after the one being verified, valid for one verdict.

    The verdict this branch assumes: the history keeps its first `base_length` tokens (the
    round's history plus the drafts it accepts) and then emits `token_id` (the round's
    recovered or bonus token). `token_ids` continue exactly that history: the next round's
    drafts, with the q weights they were drawn from (`probs` [n, vocab], or None).
    """

    base_length: int
    token_id: int
    token_ids: list[int]
    probs: torch.Tensor | None = None


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
        """Draft up to each request's own γ tokens (one batched call per round); the
        proposal is as wide as the largest γ."""

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
        for row, request in enumerate(requests):
            drafted = proposal.drafted(row)
            probs = None if proposal.probs is None else proposal.probs[row, 1 : len(drafted)]
            found.append([Branch(len(request.token_ids), drafted[0], drafted[1:], probs)] if len(drafted) > 1 else [])
        return found

    def release(self, seq_id: str) -> None:  # noqa: B027 (optional hook: a no-op unless a proposer holds state)
        """The sequence finished (or was cancelled): free whatever is held for it."""
