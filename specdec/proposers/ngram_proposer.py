"""N-gram prompt lookup: propose what followed the last occurrence of the context's suffix.

Strong when the output copies from its context (summarisation, editing, RAG, code). It has
no draft probabilities: the target verifies its tokens as a one-hot q. Under a grammar the
proposal stops before its first token the grammar forbids (the target could never accept it;
the proposal is still a function of the history, so verifying it stays exact).
"""

from __future__ import annotations

import numpy as np

from specdec.proposers.base import Drafts, Proposal, ProposalRequest, Proposer


def find_continuation(tokens: np.ndarray, n_min: int, n_max: int, gamma: int) -> list[int]:
    """Longest suffix first (n = n_max .. n_min): find its most recent earlier occurrence in
    `tokens` and return up to `gamma` tokens that followed it ([] when nothing matches)."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n :]
        # windows[i] = tokens[i : i + n] for every start i whose window ends before the suffix
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + gamma].tolist()
    return []


class NgramProposer(Proposer):
    """Prompt-lookup proposer over each sequence's own history (prompt + generated)."""

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram n_min ({n_min}) and n_max ({n_max}) must satisfy 1 <= n_min <= n_max")
        self.n_min = n_min
        self.n_max = n_max

    names = ("ngram",)

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        proposal = []
        for request in requests:
            tokens = np.asarray(request.token_ids, dtype=np.int64)
            drafted = find_continuation(tokens, self.n_min, self.n_max, request.gamma) if request.gamma > 0 else []
            cursor = request.grammar.at(request.token_ids) if drafted and request.grammar else None
            proposal.append(Drafts(drafted if cursor is None else cursor.allowed_prefix(drafted)))
        return proposal
