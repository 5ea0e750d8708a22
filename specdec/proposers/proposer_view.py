"""What the proposer has read of each row's history: what it must catch up on before drafting.

A draft model keeps each row's cache; a call first reads the history it has not seen (a
row's whole prompt the first time, everything decoded plainly since its last draft), then
drafts. The round cost model prices that reading (`RoundShape.catch_up`), so the engine
counts it: per row for the plan, per round for the measurements.
"""

from __future__ import annotations


class ProposerView:
    def __init__(self) -> None:
        self._saw: dict[str, int] = {}  # seq id -> history length at its last proposal
        self.read = 0  # history tokens this round's proposer calls read before drafting

    def start_round(self) -> None:
        self.read = 0

    def catch_up(self, seq_id: str, length: int) -> int:
        """History tokens the proposer has not seen for a row of `length` tokens (none where
        it looked ahead past them: the verify rejected drafts it had read)."""
        return max(0, length - self._saw.get(seq_id, 0))

    def proposing(self, seq_id: str, length: int) -> None:
        """A call of this round drafts for the row: it reads what it had not seen."""
        self.read += self.catch_up(seq_id, length)
        self._saw[seq_id] = length

    def drafting_ahead(self, seq_id: str, length: int) -> None:
        """The proposer works on the row's history during the verify (not this round's wait)."""
        self._saw[seq_id] = length

    def forget(self, seq_id: str) -> None:
        self._saw.pop(seq_id, None)
