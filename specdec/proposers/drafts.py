"""A row's drafts: the drafted tokens and the draft distribution q they were drawn from,
in one shape from the proposer to the verifier (in-process as a tensor, from a remote draft
as the bytes it sent, decoded only by the target)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class EncodedQ(Protocol):
    """q as the bytes the draft produced, one distribution per drafted token (a remote
    draft's reply): carried as they are from the draft to the target, which decodes them
    once, right before rejection sampling (specdec_rpc.worker.prob_codec.WireQ)."""

    def __len__(self) -> int:
        """How many distributions (drafted positions) it holds."""

    def __getitem__(self, positions: slice) -> "EncodedQ":
        """The distributions of the given positions, still encoded."""

    def decode(self, vocab_size: int) -> torch.Tensor:
        """[n, vocab_size] float32 weights, bit-exactly what the draft encoded; raises
        ValueError when the bytes are no such distributions."""


@dataclass
class Drafts:
    """One row's drafted tokens and the draft distribution q they were drawn from: what a
    proposer hands the round for a row, and what the verifier verifies (VerifyRequest).

    token_ids: up to the row's γ drafted token ids (empty: nothing drafted).
    q: per drafted token, the weights q was normalised from ([n, vocab] tensor, as an
        in-process draft drew them; specdec.sampling.sampling.normalize_probs gives q), or the
        same encoded as a remote draft sent them (EncodedQ, decoded only by the target),
        or None (no probabilities: n-gram drafts, greedy rows; verified as a one-hot q).
    """

    token_ids: list[int] = field(default_factory=list)
    q: torch.Tensor | EncodedQ | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def first(self, n: int) -> "Drafts":
        """The first n drafts (all of them when there are fewer), with their q."""
        if n >= len(self.token_ids):
            return self
        return Drafts(self.token_ids[:n], None if self.q is None or n == 0 else self.q[:n])
