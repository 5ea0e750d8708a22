"""Drafting ahead: the proposer works while the target verifies.

When verification runs elsewhere (a target worker), the proposer would idle while the
target verifies and the target would idle while the proposer drafts. Two ways overlap them:

* **Two micro-batches.** With several requests, the batch is split in two: while the
  target verifies one half, the proposer drafts for the other half from its (final)
  history; next step the halves swap. Every draft is used; nothing is speculative.
* **Look-ahead** (PEARL's "post-verify", Liu et al., ICLR 2025): while
  the target verifies a row's drafts d1..dγ, the proposer drafts the next round for the
  verdicts worth guessing (`Proposer.look_ahead`), each a *branch*: "the history keeps its
  first n tokens, then the target emits t". The plain look-ahead has one branch, every di
  accepted and the bonus token the draft's own next guess; a draft model also drafts for a
  rejection at d1, d2, ... with its next-best token there and for its next-best bonus token
  (in that order, `branches` of them).

When the verdict arrives, the branch that assumed it (if any) is used: its drafts continue
exactly the history the sequence now has, and become the next round's drafts with the q
they were drawn from. The other branches are thrown away (the proposer rolls its cache back
by itself at its next call). Without a matching branch, the row's next round verifies
without drafts where its step looks ahead again (one token, the target's; the look-ahead
drafted meanwhile branches on that token: `plain_misses`), so no look-ahead round waits for a
proposal; in a sequential step it is proposed for as usual.

Nothing here is configured but on/off (`speculation.overlap`): each kind of step (how many
rows, greedy or sampled) measures sequential rounds, looking ahead and (several rows)
micro-batches and keeps the fastest (`OverlapChoice`; a new number of rows starts from what
the nearest one measured, so it does not pay again for measuring the ways that lost there);
the look-ahead drafts the branches
that have been hitting (`LookAheadHits`), as far as fits in the verify (`LookAheadDepth`).

Losslessness: only the target decides what is emitted. The final token is sampled by the
target as in any round; the look-ahead tokens are ordinary proposals, drawn from the
draft's distribution given the very history they are verified against (which branch is used
depends only on the target's verdict, never on the branch's own draws), so Leviathan's rule
applies to them unchanged. Greedy output stays the target's greedy output, sampled output
follows the target's distribution exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from specdec.round.look_ahead_depth import LookAheadDepth
from specdec.round.look_ahead_hits import LookAheadHits
from specdec.round.overlap_choice import LOOK_AHEAD, MICRO_BATCHES, SEQUENTIAL, OverlapChoice
from specdec.round.sequential_estimate import SequentialEstimate
from specdec.proposers.base import Branch, Drafts, ProposalRequest
from specdec.requests.sequence import Sequence
from specdec.sampling.grammar_row import draft_cursor
from specdec.verifiers.verifier import VerifyRequest, VerifyResult

MIN_ROUNDS_BEFORE_GATING = 4  # a row's own acceptance is trusted after this many rounds
MOST_CUT = 1  # a look-ahead drafts at most this many drafts fewer than γ (docs/drafting_ahead.md)
BATCH_BRANCHES = 6  # branches per row when several rows look ahead together (docs/drafting_ahead.md)
LONE_WAYS = (LOOK_AHEAD, SEQUENTIAL)  # a lone row: looking ahead is the point of drafting ahead
BATCH_WAYS = (SEQUENTIAL, LOOK_AHEAD, MICRO_BATCHES)  # several rows: overlap must prove itself


@dataclass
class LookAhead:
    """Tokens drafted ahead for one row.

    base_length: the history length they continue (the round's history + its drafts + e0).
    drafts: e1.. (the next round's drafts) with their q.
    """

    base_length: int
    drafts: Drafts


def step_kind(speculating: list[Sequence]) -> tuple[int, str]:
    """The kind of step a choice is kept for: (the rows rounded down to a power of two,
    whether they sample greedily, at temperature or both)."""
    greedy = {seq.request.sampling.is_greedy for seq in speculating}
    sampling = "mixed" if len(greedy) > 1 else "greedy" if greedy == {True} else "sampled"
    return 1 << (len(speculating).bit_length() - 1), sampling


class DraftAhead:
    """Keeps the drafts made ahead for each row between rounds, chooses how each step
    overlaps drafting with verifying, and counts how often a look-ahead was usable.

    min_acceptance: a row whose own acceptance rate (after a few rounds) is below this does
        not look ahead: its look-ahead would mostly be thrown away (wasted draft work).
    way: run every step this way (SEQUENTIAL, LOOK_AHEAD or MICRO_BATCHES: tests and
        baselines); None: each kind of step (`step_kind`) measures the ways (OverlapChoice)
        and keeps the fastest.
    branches: how many verdicts of a round a look-ahead drafts for (Proposer.look_ahead's
        order; 1: only that every draft is accepted); None: measured (LookAheadHits), at most
        BATCH_BRANCHES per row when several rows look ahead.
    block_rounds, explore_every: the measured choices' blocks (OverlapChoice).
    depth: how many drafts a look-ahead makes (None: as many as fit in the verify, LookAheadDepth,
        but at most MOST_CUT fewer than γ: a look-ahead's fixed work does not shrink with its
        depth, so cutting deeper than that lost more tokens than time).
    plain_misses: a row whose look-ahead missed verifies its next look-ahead round without
        drafts (one token, the target's) instead of waiting for a fresh proposal: the round
        never waits for a draft call, and the look-ahead drafted during that verify guesses a
        single token, which it ranks among its first few far more often than a whole round's
        verdict (docs/drafting_ahead.md). False: such rows are proposed for afresh first.
    """

    def __init__(self, min_acceptance: float = 0.3, way: str | None = None, branches: int | None = None,
                 hits: LookAheadHits | None = None, block_rounds: int = 24, explore_every: int = 6,
                 depth: LookAheadDepth | None = None, plain_misses: bool = True) -> None:
        if way not in (None, *BATCH_WAYS):
            raise ValueError(f"unknown way {way!r}")
        self.min_acceptance = min_acceptance
        self.way = way
        self.fixed_branches = branches
        self.branch_hits = hits or LookAheadHits()
        self.branches = branches or self.branch_hits.most  # the running step's look-ahead branches
        self.depth = depth or LookAheadDepth(most_cut=MOST_CUT)
        self._drafts_ahead = 0  # the most drafts a row of the running step's look-ahead asked for
        self.blocks = (block_rounds, explore_every)
        self.choices: dict[tuple[int, str], OverlapChoice] = {}  # step_kind -> its measured choice
        # the running step's way, and its kind and choice when the step is counted
        self._step: tuple[str, tuple[int, str] | None, OverlapChoice | None] = (SEQUENTIAL, None, None)
        self._ready: dict[str, LookAhead] = {}
        self.plain_misses = plain_misses
        self._missed: set[str] = set()  # rows whose last look-ahead missed the verdict
        self.plain_rounds = 0  # rows that verified without drafts after a missed look-ahead
        self.rows_ahead = 0  # rows that looked ahead
        self.hits = 0  # ... whose look-ahead became the next round's drafts
        self.rejection_hits = 0  # ... of those, through a branch that assumed a rejected draft
        self.stored = 0  # drafts made for the other micro-batch while one was verified
        self.steps_by_way: dict[str, int] = {}  # way -> steps run that way
        self.clock = time.perf_counter
        self.estimate = SequentialEstimate()  # what sequential rounds would emit (a look-ahead's fast exit)
        self._last_done = -math.inf  # when the last step's round ended (clock)
        self._share = 1.0  # the running step's rows verified now over its batch's (micro-batches: about half)

    @property
    def hit_rate(self) -> float:
        """Share of look-aheads that were ready and right when the verdict arrived."""
        return self.hits / self.rows_ahead if self.rows_ahead else 0.0

    @property
    def overlaps(self) -> bool:
        """Whether the running step drafts while the target verifies (else it verifies in the
        caller's thread: no hand-over to the verifier's for nothing)."""
        return self._step[0] != SEQUENTIAL

    @property
    def lone_choice(self) -> OverlapChoice | None:
        """The measured choice of a lone request's steps (greedy first; None before one ran)."""
        return self.choices.get((1, "greedy")) or self.choices.get((1, "sampled"))

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

    def verifies_plainly(self, seq: Sequence) -> bool:
        """Whether a row without drafts made ahead verifies without any this round (and is
        not proposed for): its last look-ahead missed, this step looks ahead again and the
        row is still worth a look-ahead (a row gated off by its acceptance would verify one
        token at a time with nothing drafted meanwhile: it is proposed for instead)."""
        plain = (self.plain_misses and self._step[0] == LOOK_AHEAD and seq.seq_id in self._missed
                 and self._worth(seq))
        self.plain_rounds += plain
        return plain

    def wants(self, drafted: int, accepted: int, rounds: int) -> bool:
        """Whether a row with these statistics should draft ahead."""
        if rounds < MIN_ROUNDS_BEFORE_GATING or drafted == 0:
            return True
        return accepted / drafted >= self.min_acceptance

    def split(self, batch: list[Sequence], gammas: dict[str, int]) -> tuple[list[Sequence], list[Sequence]]:
        """(rows verified now, speculating rows drafted for while they verify), as this
        step's way says: with micro-batches rows whose drafts are ready go now, and when none
        are, half of the speculating rows do; otherwise every row goes now."""
        speculating = [seq for seq in batch if gammas[seq.seq_id] > 0]
        way = self._choose(batch, speculating)
        if way != LOOK_AHEAD:  # no look-ahead this step: no row's verdict is a miss any more
            self._missed.difference_update(seq.seq_id for seq in batch)
        self._share = 1.0
        if way != MICRO_BATCHES:
            return batch, []
        ready = [seq for seq in speculating if self.is_ready(seq.seq_id, seq.token_ids)]
        if not ready:
            ready = speculating[: (len(speculating) + 1) // 2]
        later = {seq.seq_id for seq in speculating} - {seq.seq_id for seq in ready}
        now = [s for s in batch if s.seq_id not in later]
        self._share = len(now) / len(batch) if batch else 1.0
        return now, [s for s in batch if s.seq_id in later]

    def _choose(self, batch: list[Sequence], speculating: list[Sequence]) -> str:
        """This step's way: the fixed one, or its kind's measured choice. A step with a row in
        its first round (a prefill: not a typical round's time) or none speculating is not
        counted."""
        kind = step_kind(speculating) if self.way is None and speculating else None
        choice = self._choice_for(kind) if kind is not None else None
        way = self.way or (choice.way if choice is not None else SEQUENTIAL)
        counted = choice is not None and not any(seq.stats.rounds == 0 for seq in batch)
        self.steps_by_way[way] = self.steps_by_way.get(way, 0) + 1
        self._step = (way, kind, choice) if counted else (way, None, None)
        return way

    def _choice_for(self, kind: tuple[int, str]) -> OverlapChoice:
        """The kind's measured choice; a new kind of several rows starts from what the others measured."""
        if kind not in self.choices:
            ways = LONE_WAYS if kind[0] == 1 else BATCH_WAYS
            self.choices[kind] = OverlapChoice(ways, *self.blocks, presumed=self._presumed(kind, ways))
        return self.choices[kind]

    def _presumed(self, kind: tuple[int, str], ways: tuple[str, ...]) -> dict[str, float]:
        """Each way's rate over sequential rounds as measured for the nearest number of rows
        (several rows, the same sampling): a look-ahead's or a half batch's cost against the
        verify changes with the rows, but slowly, so a short run of a new kind of step does
        not pay again for measuring the ways that lost next to it. A lone row is its own case."""
        rows, sampling = kind
        others = sorted((abs(r.bit_length() - rows.bit_length()), -r, choice)
                        for (r, s), choice in self.choices.items() if s == sampling and r > 1 and rows > 1)
        presumed = {}
        for way in ways:
            ratio = next((c.ratio(way) for _, _, c in others if c.ratio(way) is not None), None)
            if ratio is not None:
                presumed[way] = ratio
        return presumed

    def asks(self, now: list[Sequence], later: list[Sequence], requests: list[VerifyRequest], gammas) -> list:
        """What to propose while the target verifies `now`: drafts for `later` from their
        histories, or (no other rows, the step overlaps) a look-ahead for each row of `now`
        worth it: its history plus this round's drafts, with the next round's γ (0 = not
        this row)."""
        self._drafts_ahead = 0
        if later:
            return [ProposalRequest(seq.seq_id, seq.token_ids, seq.request.sampling, seq.request.proposer,
                                    gammas[seq.seq_id], seq.num_prompt_tokens, seq.reserve_tokens,
                                    draft_cursor(seq.grammar, len(seq.token_ids))) for seq in later]
        overlaps = self.overlaps
        asks = [ProposalRequest(seq.seq_id, [*request.token_ids, *request.draft_token_ids], seq.request.sampling,
                                seq.request.proposer, self._drafts_for(seq, gammas[seq.seq_id]) if overlaps else 0,
                                seq.num_prompt_tokens, seq.reserve_tokens,
                                draft_cursor(seq.grammar, len(seq.token_ids)))
                for seq, request in zip(now, requests)]
        looking = sum(1 for ask in asks if ask.gamma > 0)
        self._missed.difference_update(ask.seq_id for ask in asks if ask.gamma == 0)  # no look-ahead, no miss
        self.rows_ahead += looking
        self._drafts_ahead = max((ask.gamma for ask in asks), default=0)
        if looking:
            self.branches = self.fixed_branches or self.branch_hits.branches()
            if looking > 1 and not self.fixed_branches:  # each branch is a row of the draft's forward
                self.branches = min(self.branches, BATCH_BRANCHES)
        return asks

    def _drafts_for(self, seq: Sequence, gamma: int) -> int:
        """How many drafts the row's look-ahead makes (0: it does not look ahead)."""
        return self.depth.depth(gamma) if gamma > 0 and self._worth(seq) else 0

    def verdict_waited(self, ahead_s: float, waited_s: float) -> None:
        """The step's look-ahead took `ahead_s`, then the round waited `waited_s` for the verdict."""
        if self._drafts_ahead > 0:
            self.depth.record(self._drafts_ahead, ahead_s, waited_s)
        self._drafts_ahead = 0

    def _worth(self, seq: Sequence) -> bool:
        """Whether the row's own acceptance makes its look-ahead worth drafting."""
        return self.wants(seq.stats.drafted, seq.stats.accepted, seq.stats.rounds)

    def round_done(self, emitted: int, seconds: float, rows: list[tuple[int, int, int]] | None = None) -> None:
        """The step's round emitted `emitted` tokens in `seconds`: counted by its kind's choice,
        with the engine's own work since the previous step ended (a way of more, shorter steps,
        micro-batches, pays it more often; a gap longer than the round itself is idle time).
        rows: each verified row's (γ, drafted, accepted): in a look-ahead or micro-batch step,
        what sequential rounds would have emitted on the same text (the choice's fast exit and
        early end of an exploration, `_sequential_tokens`)."""
        now = self.clock()
        gap = now - seconds - self._last_done
        if 0 < gap <= seconds:
            seconds += gap
        self._last_done = now
        way, kind, choice = self._step
        sequential = self._sequential_tokens(way, emitted, rows)
        if rows:
            self.estimate.observe(rows)
        if choice is not None:
            if choice.rounds_left == 1:  # its next block's way follows what the other kinds measured by now
                choice.presumed = {**choice.presumed, **self._presumed(kind, choice.ways)}
            choice.record(emitted, seconds, sequential)
        self._step = (way, None, None)

    def _sequential_tokens(self, way: str, emitted: int, rows: list[tuple[int, int, int]] | None) -> float | None:
        """What one sequential round of the whole batch would have emitted on the text of this
        step (None: unknown). A look-ahead step's rows: estimated (SequentialEstimate). A
        micro-batch step's rows verify drafts proposed from their final histories, as a
        sequential round's are, so they emit what it would; the rows it left to the other half
        are taken to emit as much per row (`_share`: the rows verified now over the batch's)."""
        if not rows:
            return None
        if way == LOOK_AHEAD:
            return self.estimate.tokens(rows)
        if way == MICRO_BATCHES and self._share > 0:
            return emitted / self._share
        return None

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
            self.branch_hits.record(len(branches), None if hit is None else branches.index(hit))
        if branches and hit is None:
            self._missed.add(request.seq_id)
        else:
            self._missed.discard(request.seq_id)
        if hit is not None:
            self._ready[request.seq_id] = LookAhead(base + 1, hit.drafts())
            self.hits += 1
            self.rejection_hits += result.num_accepted < len(request.draft_token_ids)

    def forget(self, seq_id: str) -> None:
        self._ready.pop(seq_id, None)
        self._missed.discard(seq_id)

