"""The `none` proposer: plain target decoding through the same round code path (γ = 0)."""

from __future__ import annotations

from specdec.proposers.base import Drafts, Proposal, ProposalRequest, Proposer


class NoProposer(Proposer):
    """Drafts nothing, so every round verifies only the pending token and emits one token."""

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        return [Drafts() for _ in requests]
