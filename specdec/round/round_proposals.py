"""RoundProposals: the proposer's calls of one round, where a failure costs drafts, never a request.

A round asks the proposer once for the rows that speculate (each with its own γ) and the
draft's prefill chunk reads; with drafting ahead, rows whose drafts were made during the last
verification take those instead, and the proposer works again while the target verifies
(drafts for the other micro-batch, or look-ahead branches). A call that fails, or a proposer
that is down, leaves the round without drafts: it runs as a plain decoding round (lossless).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence as Seq

from specdec.proposers.base import Drafts, Proposal, ProposalRequest, Proposer
from specdec.proposers.proposer_view import ProposerView
from specdec.requests.sequence import Sequence
from specdec.round.draft_ahead import DraftAhead
from specdec.round.round_timer import RoundTimer
from specdec.sampling.grammar_row import draft_cursor
from specdec.verifiers.verifier import VerifyRequest

logger = logging.getLogger(__name__)


class RoundProposals:
    """The engine's proposer calls. view: what the proposer must catch up on per row;
    timer: where the round's proposer compute is recorded; draft_ahead: None without it."""

    def __init__(self, proposer: Proposer, view: ProposerView, timer: RoundTimer,
                 draft_ahead: DraftAhead | None) -> None:
        self.proposer = proposer
        self.view = view
        self.timer = timer
        self.draft_ahead = draft_ahead
        self.failures = 0  # calls that failed (their rounds ran without drafts)

    def note_unavailable(self, batch: list[Sequence], gammas: list[int], proposal: Proposal) -> None:
        """Mark the rows that wanted drafts but got none because their proposer is down (a
        row that wanted none this round, e.g. its last, keeps its mark)."""
        for i, (seq, gamma) in enumerate(zip(batch, gammas)):
            if gamma > 0:
                missing = len(proposal[i]) == 0
                seq.stats.speculation_unavailable = (
                    missing and self.proposer.unavailable(seq.request.proposer) is not None
                )

    def ready_drafts(self, batch: list[Sequence], gammas: list[int],
                      reads: list[ProposalRequest]) -> tuple[Proposal, set[int]]:
        """Each row's drafts made ahead when they continue its history; rows whose look-ahead
        missed verify without drafts where the step looks ahead again (DraftAhead.verifies_plainly);
        the other speculating rows are proposed for now, before their verification, in one
        call with the draft's chunk reads. Returns the proposal and the rows proposed for now."""
        ahead = self.draft_ahead
        ready = [ahead.take(seq.seq_id, seq.token_ids, g) for seq, g in zip(batch, gammas)]
        missing = [i for i, drafts in enumerate(ready)
                   if not drafts and gammas[i] > 0 and not ahead.verifies_plainly(batch[i])]
        self.timer.propose_compute_s = 0.0
        if missing or reads:
            fresh = self.propose([batch[i] for i in missing], [gammas[i] for i in missing], reads)
            for i, drafts in zip(missing, fresh):
                ready[i] = drafts
        return ready, set(missing)

    def during_verify(self, now: list[Sequence], later: list[Sequence], requests: list[VerifyRequest], gammas):
        """The proposer's work while the target verifies `now` (DraftAhead.asks): drafts for
        `later`, or look-ahead branches for `now`. Returns (one Drafts per ask, or a list of
        branches per row of `now`, or None; seconds it took)."""
        start = time.perf_counter()
        asks = self.draft_ahead.asks(now, later, requests, gammas)
        used = [ask.gamma > 0 for ask in asks]
        if not any(used):
            return None, 0.0
        active = [ask for ask, use in zip(asks, used) if use]
        for ask in active:
            self.view.drafting_ahead(ask.seq_id, len(ask.token_ids))
        try:
            if later:
                found = iter(self.proposer.propose(active))
                meanwhile = [next(found) if use else Drafts() for use in used]
            else:
                unverified = [len(request.draft_token_ids) for request, use in zip(requests, used) if use]
                found = iter(self.proposer.look_ahead(active, unverified, self.draft_ahead.branches))
                meanwhile = [next(found) if use else [] for use in used]
        except Exception:
            self.failures += 1
            logger.exception("drafting ahead failed; the next round proposes as usual")
            return None, time.perf_counter() - start
        self.timer.add_propose_compute(time.perf_counter() - start, getattr(self.proposer, "last_compute_s", None))
        return meanwhile, time.perf_counter() - start

    def propose(self, batch: list[Sequence], gammas: list[int], reads: Seq[ProposalRequest] = ()) -> Proposal:
        """One proposer call for the rows that speculate, each with its own γ, and the draft's
        prefill chunk reads (`reads`: their drafts are dropped). A failing proposer costs this
        round its drafts (lossless), never a request."""
        full = [Drafts() for _ in batch]
        rows = [i for i, g in enumerate(gammas) if g > 0]
        self.timer.propose_compute_s = 0.0  # no call, no compute
        if not rows and not reads:
            return full
        requests = [ProposalRequest(batch[i].seq_id, batch[i].token_ids, batch[i].request.sampling,
                                    batch[i].request.proposer, gammas[i], batch[i].num_prompt_tokens,
                                    batch[i].reserve_tokens, draft_cursor(batch[i].grammar, len(batch[i].token_ids)))
                    for i in rows]
        for request in (*requests, *reads):
            self.view.proposing(request.seq_id, len(request.token_ids))
        requests += reads
        try:
            part = self.proposer.propose(requests)
            self.timer.propose_compute_s = getattr(self.proposer, "last_compute_s", None)
        except Exception:
            self.failures += 1
            logger.exception("proposer failed; this round runs without drafts")
            return full
        for i, drafts in zip(rows, part):
            full[i] = drafts.first(gammas[i])  # never more than asked
        return full
