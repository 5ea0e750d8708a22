"""Drafting ahead: the proposer works while the target verifies.

When verification runs elsewhere (a target worker), the proposer would idle while the
target verifies and the target would idle while the proposer drafts. Two ways overlap them:

* **Two micro-batches.** With several requests, the batch is split in two: while the
  target verifies one half, the proposer drafts for the other half from its (final)
  history; next step the halves swap. Every draft is used; nothing is speculative.
* **Look-ahead** (PEARL's "post-verify", Liu et al., ICLR 2025), for a lone group: while
  the target verifies a row's drafts d1..dγ, the proposer drafts the next round for the
  verdicts worth guessing (`Proposer.look_ahead`), each a *branch*: "the history keeps its
  first n tokens, then the target emits t". The plain look-ahead has one branch, every di
  accepted and the bonus token the draft's own next guess; a draft model also drafts for a
  rejection at d1, d2, ... with its next-best token there and for its next-best bonus token
  (in that order, `branches` of them).

When the verdict arrives, the branch that assumed it (if any) is used: its drafts continue
exactly the history the sequence now has, and become the next round's drafts with the q
they were drawn from. The other branches are thrown away (the proposer rolls its cache back
by itself at its next call); without a matching branch the row's next round is proposed as
usual, before its verification (while that verification runs, the proposer drafts ahead
again).

Losslessness: only the target decides what is emitted. The final token is sampled by the
target as in any round; the look-ahead tokens are ordinary proposals, drawn from the
draft's distribution given the very history they are verified against (which branch is used
depends only on the target's verdict, never on the branch's own draws), so Leviathan's rule
applies to them unchanged. Greedy output stays the target's greedy output, sampled output
follows the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.round.look_ahead_hits import LookAheadHits
from specdec.round.overlap_choice import OverlapChoice
from specdec.proposers.base import Branch, Drafts, ProposalRequest
from specdec.requests.sequence import Sequence
from specdec.verifiers.verifier import VerifyRequest, VerifyResult

MIN_ROUNDS_BEFORE_GATING = 4  # a row's own acceptance is trusted after this many rounds


@dataclass
class LookAhead:
    """Tokens drafted ahead for one row.

    base_length: the history length they continue (the round's history + its drafts + e0).
    drafts: e1.. (the next round's drafts) with their q.
    """

    base_length: int
    drafts: Drafts


class DraftAhead:
    """Keeps the drafts made ahead for each row between rounds, and counts how often a
    look-ahead was usable.

    min_acceptance: a row whose own acceptance rate (after a few rounds) is below this does
        not look ahead: its look-ahead would mostly be thrown away (wasted draft work).
    micro_batches: split a batch of several requests into two halves that take turns
        (False: every step verifies the whole batch and looks ahead).
    branches: how many verdicts of a round a look-ahead drafts for (Proposer.look_ahead's
        order; 1: only that every draft is accepted).
    max_rows: look ahead only while the step verifies at most this many speculating rows
        (None: any number); larger steps wait for the verdict (sequential rounds).
    choice: measures rounds that could look ahead with and without doing so and keeps the
        faster way (None: they always look ahead).
    hits: counts how often greedy and sampled rows' look-aheads hit; a kind that rarely
        hits stops looking ahead (None: LookAheadHits(0.0), every kind looks ahead).
    """

    def __init__(self, min_acceptance: float = 0.3, micro_batches: bool = True, branches: int = 3,
                 max_rows: int | None = None, choice: OverlapChoice | None = None,
                 hits: LookAheadHits | None = None) -> None:
        self.min_acceptance = min_acceptance
        self.micro_batches = micro_batches
        self.branches = branches
        self.max_rows = max_rows
        self.choice = choice
        self.kind_hits = hits or LookAheadHits(min_hit_rate=0.0)
        self._could_look_ahead = False  # the step being run could look ahead (counted by `choice`)
        self._ready: dict[str, LookAhead] = {}
        self.rows_ahead = 0  # rows that looked ahead
        self.hits = 0  # ... whose look-ahead became the next round's drafts
        self.rejection_hits = 0  # ... of those, through a branch that assumed a rejected draft
        self.stored = 0  # drafts made for the other micro-batch while one was verified

    @property
    def hit_rate(self) -> float:
        """Share of look-aheads that were ready and right when the verdict arrived."""
        return self.hits / self.rows_ahead if self.rows_ahead else 0.0

    def is_ready(self, seq_id: str, history: list[int]) -> bool:
        """Whether drafts made ahead continue this row's history."""
        ahead = self._ready.get(seq_id)
        return ahead is not None and ahead.base_length == len(history)

    def store(self, seq_id: str, history: list[int], drafts: Drafts) -> None:
        """Keep drafts proposed from the row's current history (the other micro-batch)."""
        self._ready[seq_id] = LookAhead(len(history), drafts)
        self.stored += 1

    def take(self, seq_id: str, history: list[int], gamma: int) -> Drafts:
        """This round's drafts for a row: its look-ahead, cut to γ, when it continues the
        history; none otherwise. The look-ahead is used once."""
        ahead = self._ready.pop(seq_id, None)
        if ahead is None or ahead.base_length != len(history) or gamma <= 0:
            return Drafts()
        return ahead.drafts.first(gamma)

    def wants(self, drafted: int, accepted: int, rounds: int) -> bool:
        """Whether a row with these statistics should draft ahead."""
        if rounds < MIN_ROUNDS_BEFORE_GATING or drafted == 0:
            return True
        return accepted / drafted >= self.min_acceptance

    def split(self, batch: list[Sequence], gammas: dict[str, int]) -> tuple[list[Sequence], list[Sequence]]:
        """(rows verified now, speculating rows drafted for while they verify). Rows whose
        drafts are ready go now; when none are, half of the speculating rows do."""
        speculating = [seq for seq in batch if gammas[seq.seq_id] > 0]
        if not self.micro_batches:
            return batch, []
        ready = [seq for seq in speculating if self.is_ready(seq.seq_id, seq.token_ids)]
        if not ready:
            ready = speculating[: (len(speculating) + 1) // 2]
        later = {seq.seq_id for seq in speculating} - {seq.seq_id for seq in ready}
        return [s for s in batch if s.seq_id not in later], [s for s in batch if s.seq_id in later]

    def asks(self, now: list[Sequence], later: list[Sequence], requests: list[VerifyRequest], gammas) -> list:
        """What to propose while the target verifies `now`: drafts for `later` from their
        histories, or (no other rows) a look-ahead for each row of `now`: its history plus
        this round's drafts, with the next round's γ (0 = not this row)."""
        if later:
            return [ProposalRequest(seq.seq_id, seq.token_ids, seq.request.sampling, seq.request.proposer,
                                    gammas[seq.seq_id], seq.num_prompt_tokens) for seq in later]
        fits = self.max_rows is None or sum(1 for seq in now if gammas[seq.seq_id] > 0) <= self.max_rows
        first_round = any(seq.stats.rounds == 0 for seq in now)  # a prefill: not a typical round's time
        worth = [fits and gammas[seq.seq_id] > 0 and self._worth_looking_ahead(seq) for seq in now]
        self._could_look_ahead = not first_round and any(worth)
        chosen = self.choice is None or self.choice.looks_ahead
        asks = [ProposalRequest(seq.seq_id, [*request.token_ids, *request.draft_token_ids], seq.request.sampling,
                                seq.request.proposer, gammas[seq.seq_id] if chosen and looks else 0,
                                seq.num_prompt_tokens)
                for seq, request, looks in zip(now, requests, worth)]
        self.rows_ahead += sum(1 for ask in asks if ask.gamma > 0)
        return asks

    def _worth_looking_ahead(self, seq: Sequence) -> bool:
        """The row's own acceptance and its kind's (greedy or sampled) hit rate allow it."""
        stats = seq.stats
        return self.wants(stats.drafted, stats.accepted, stats.rounds) and \
            self.kind_hits.allows(seq.request.sampling.is_greedy)

    def round_done(self, emitted: int, seconds: float) -> None:
        """The step's round emitted `emitted` tokens in `seconds`: counted by the choice when
        the step could look ahead."""
        if self.choice is not None and self._could_look_ahead:
            self.choice.record(emitted, seconds)
        self._could_look_ahead = False

    def after_verdict(self, later: list[Sequence], requests, results, meanwhile) -> None:
        """Keep what was proposed during verification: the other half's drafts (one Drafts
        per row of `later`), or the look-ahead branch (one list per row of `requests`) that
        the verdict confirmed."""
        if later:
            for seq, drafts in zip(later, meanwhile):
                self.store(seq.seq_id, seq.token_ids, drafts)
            return
        for request, result, branches in zip(requests, results, meanwhile):
            self.keep(request, result, branches)

    def keep(self, request: VerifyRequest, result: VerifyResult, branches: list[Branch]) -> None:
        """Store the branch that assumed this verdict as the row's next drafts (if any)."""
        base = len(request.token_ids) + result.num_accepted  # the history the verdict keeps
        hit = next((b for b in branches if b.base_length == base and b.token_id == result.emitted[-1]
                    and b.token_ids), None)
        if branches:
            self.kind_hits.record(request.sampling.is_greedy, hit is not None)
        if hit is not None:
            self._ready[request.seq_id] = LookAhead(base + 1, hit.drafts())
            self.hits += 1
            self.rejection_hits += result.num_accepted < len(request.draft_token_ids)

    def forget(self, seq_id: str) -> None:
        self._ready.pop(seq_id, None)

