"""PrefillChunks: how much of each new prompt the target reads this round (chunked prefill).

Without chunks, a row's first round reads its whole prompt inside the round's one target
forward, and every row of the batch waits for it: a 2,000-token prompt stalls the streams
already decoding for the length of its prefill. With a token budget per round (Sarathi-Serve),
prompts are read at most `budget` tokens per round, first come first served, interleaved
with the decode rounds of the running rows. A row still reading its prompt (a *prefill
chunk*) is verified with its history cut at the chunk's end and no drafts: the target
caches the chunk and the token it samples there is dropped, so the row emits nothing and
drafts nothing. Its last chunk is an ordinary first round (the prompt's rest, γ drafts, the
first token), so the output equals the unchunked one. A row the budget does not reach sits
this round out. The draft reads the same chunks (`SpeculativeEngine`), not the whole prompt
at its first draft. While rows decode, a `PrefillPace` (when given) sizes the round's budget
from measured round times, so that prompts slow the decoding rows by a bounded share.
"""

from __future__ import annotations

from specdec.proposers.base import ProposalRequest
from specdec.requests.sequence import Sequence
from specdec.round.prefill_pace import PrefillPace
from specdec.verifiers.verifier import VerifyRequest


class PrefillChunks:
    def __init__(self, budget: int | None, pace: PrefillPace | None = None) -> None:
        """budget: prompt tokens the target reads per round, over all rows (None or 0: whole prompts).
        pace: while rows decode, at most its allowance of them (None: always the budget)."""
        if budget is not None and budget < 0:
            raise ValueError(f"prefill_chunk_tokens must be >= 0 or None, got {budget}")
        self.budget = budget or None
        self.pace = pace if self.budget is not None else None
        self._paced: int | None = None  # prompt tokens of this round's plan, when paced (rows decode)

    def plan(self, running: list[Sequence], width: int = 1) -> list[Sequence]:
        """Set each row's `chunk_end` for this round and return the rows that take part (the
        others wait for budget). Rows are served in the order given (their admission). While
        rows decode, the pace bounds only long prompts (`paced`): a prompt the budget reads in
        one round is read at once, as without a pace, so ordinary requests start as soon.
        width: the decode rows' widest verify row (γ + 1), what a chunk reads riding their
        forward (`PrefillPace`). A paced prompt's last chunk stops one token short, so that its
        first round reads only its pending token (riding too) instead of a catch-up of its own."""
        decoding = any(seq.stats.rounds > 0 for seq in running)
        paced = self.pace is not None and decoding
        left = self.budget
        allowed = min(left, self.pace.allowance(width)) if paced else left  # what long prompts may still read
        start, taking_part = left, []
        for seq in running:
            seq.chunk_end = None
            if left is None or seq.stats.rounds > 0:
                taking_part.append(seq)
                continue
            unread = len(seq.token_ids) - seq.prefilled  # the prompt's rest and its pending token
            cap = min(left, allowed) if self.long(seq) else left
            if paced and self.long(seq) and 1 < unread <= cap:
                cap = unread - 1  # all but the pending token: the first round then rides
            if unread <= cap:  # its last chunk: an ordinary first round
                read = unread
            elif cap > 0:
                read = cap
                seq.chunk_end = seq.prefilled + cap
            else:
                continue
            left, allowed = left - read, max(0, allowed - read)
            taking_part.append(seq)
        self._paced = start - left if paced else None
        return taking_part

    def long(self, seq: Sequence) -> bool:
        """A prompt the budget reads in more than one round (the pace bounds only these)."""
        return self.budget is not None and seq.num_prompt_tokens > self.budget

    def round_done(self, seconds: float) -> None:
        """The planned round took `seconds`: the pace learns from rounds beside decoding rows."""
        if self._paced is not None:
            self.pace.record(seconds, self._paced)
            self._paced = None

    @staticmethod
    def verify_request(seq: Sequence) -> VerifyRequest:
        """The target's part of a prefill chunk: the history cut at the chunk's end, no drafts
        (a first chunk takes the row's cache reserve)."""
        return VerifyRequest(seq.seq_id, seq.token_ids[: seq.chunk_end], [], seq.request.sampling,
                             reserve_tokens=seq.reserve_tokens)

    @staticmethod
    def proposal_request(seq: Sequence) -> ProposalRequest:
        """The draft's part of a prefill chunk: one draft (dropped) on the cut history (a first
        chunk takes the row's draft cache reserve)."""
        return ProposalRequest(seq.seq_id, seq.token_ids[: seq.chunk_end], seq.request.sampling,
                               seq.request.proposer, 1, reserve_tokens=seq.reserve_tokens)

    @staticmethod
    def done(rows: list[Sequence]) -> None:
        """The rows' chunks were read: the target holds each history up to its chunk's end."""
        for seq in rows:
            seq.prefilled, seq.chunk_end = seq.chunk_end, None
