"""CompositeProposer: each request drafts with the proposer it names (draft model or n-gram)."""

from __future__ import annotations

import time

from specdec.proposers.base import Branch, Drafts, Proposal, ProposalRequest, Proposer


class CompositeProposer(Proposer):
    """Groups a round's requests by proposer name and makes one call per proposer; each
    row keeps its own proposer's drafts (rows without q are verified as a one-hot q)."""

    last_compute_s: float | None = None  # worker compute of the last call (remote parts report theirs)

    def __init__(self, proposers: dict[str, Proposer], default: str) -> None:
        if default not in proposers:
            raise ValueError(f"default proposer {default!r} is not one of {sorted(proposers)}")
        self.proposers = proposers
        self.default = default
        self.has_probs = any(p.has_probs for p in proposers.values())
        self.names = tuple(sorted(proposers))

    def _kind(self, request: ProposalRequest) -> str:
        kind = request.proposer or self.default
        if kind not in self.proposers:
            raise ValueError(f"proposer {kind!r} is not available here (have {sorted(self.proposers)})")
        return kind

    def _groups(self, requests: list[ProposalRequest]) -> dict[str, list[int]]:
        """Row indices by the proposer they ask for."""
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(self._kind(request), []).append(i)
        return groups

    def _timed(self, kind: str, call):
        """call(the proposer of `kind`), adding its compute (its wall time when it reports none)."""
        called = time.perf_counter()
        result = call(self.proposers[kind])
        compute = getattr(self.proposers[kind], "last_compute_s", None)
        self.last_compute_s += time.perf_counter() - called if compute is None else compute
        return result

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        proposal = [Drafts() for _ in requests]
        self.last_compute_s = 0.0
        for kind, rows in self._groups(requests).items():
            # _timed calls each lambda at once, so it sees this iteration's rows
            part = self._timed(kind, lambda p: p.propose([requests[i] for i in rows]))  # noqa: B023
            for row, drafts in zip(rows, part):
                proposal[row] = drafts
        return proposal

    def look_ahead(self, requests: list[ProposalRequest], unverified: list[int],
                   branches: int = 1) -> list[list[Branch]]:
        found: list[list[Branch]] = [[] for _ in requests]
        self.last_compute_s = 0.0
        for kind, rows in self._groups(requests).items():
            part = self._timed(kind, lambda p: p.look_ahead(  # called at once, as above
                [requests[i] for i in rows], [unverified[i] for i in rows], branches))  # noqa: B023
            for i, row_branches in zip(rows, part):
                found[i] = row_branches
        return found

    @property
    def unavailable_reason(self) -> str | None:
        return next((p.unavailable_reason for p in self.proposers.values() if p.unavailable_reason), None)

    def unavailable(self, name: str | None) -> str | None:
        proposer = self.proposers.get(name or self.default)
        return None if proposer is None else proposer.unavailable(name)

    def release(self, seq_id: str) -> None:
        for proposer in self.proposers.values():
            proposer.release(seq_id)
