"""SpeculativeEngine: rounds of propose -> verify -> accept -> roll back for a batch of sequences.

The engine owns the requests (history, stop conditions, statistics) and drives two
swappable parts: a Proposer (draft model, n-gram, none) and a Verifier (the target). Both
are in-process objects here; the distributed router plugs gRPC clients of the draft worker
and the target group into the same engine. Every round shares one proposer call and one
target forward across all active sequences (continuous batching at round granularity):
waiting requests join at the next round, finished ones leave and free their cache slots.

Isolation: a request only ever affects itself. It is validated against the server's
limits before it joins (`RequestLimits`); each row drafts its own γ, clipped to its
budget and context (`RoundPlanner`); a proposer failure costs the round its drafts, never
a request; and when a round fails for a reason one row may have caused, the batch is split
and retried so that only the rows that fail alone fail (a `WorkerError`, which no row
causes, fails the round's whole batch). Bookkeeping after the tokens are applied (the
policy's record, releases) only logs a failure: applied tokens always reach the outputs.
"""

from __future__ import annotations

import itertools
import logging
import time

from collections.abc import Callable, Sequence as Seq

from specdec.round.draft_ahead import DraftAhead
from specdec.requests.errors import InvalidRequestError, WorkerError
from specdec.sampling.grammar_matcher import GrammarBackend
from specdec.sampling.grammar_row import GrammarRow
from specdec.policy.load_stats import RoundSample
from specdec.round.prefill_chunks import PrefillChunks
from specdec.round.prefill_pace import PrefillPace
from specdec.proposers.proposer_view import ProposerView
from specdec.proposers.base import ProposalRequest, Proposer
from specdec.requests.request import DEFAULT_CAPS, GenerationRequest, RequestCaps, RequestLimits
from specdec.round.round_timer import RoundTimer
from specdec.round.round_proposals import RoundProposals
from specdec.round.scheduler import Scheduler
from specdec.round.row_outcome import apply_verdict, fail_row
from specdec.round.row_requests import collect_prompt_logprobs, verify_request, with_prompt_logprobs
from specdec.requests.sequence import Sequence
from specdec.requests.speculation_mode import never_drafts
from specdec.round.round_output import GenerationResult, RoundOutput
from specdec.round.round_planner import RoundPlanner, unread_prompt
from specdec.policy.speculation_policy import Decision, RoundPolicy
from specdec.requests.stats import SpecStats
from specdec.requests.stop_conditions import StopChecker
from specdec.verifiers.verifier import Verifier, VerifyRequest

logger = logging.getLogger(__name__)


class SpeculativeEngine:
    """Runs speculative decoding for many sequences at once on one verifier and one proposer."""

    def __init__(
        self,
        verifier: Verifier,
        proposer: Proposer,
        gamma: int,
        eos_token_ids: Seq[int] = (),
        decode: Callable[[list[int]], str] | None = None,
        policy: RoundPolicy | None = None,
        caps: RequestCaps = DEFAULT_CAPS,
        draft_ahead: DraftAhead | None = None,
        prefill_chunk_tokens: int | None = None,
        grammars: GrammarBackend | None = None,
        prefill_slowdown: float = 0.0,
    ) -> None:
        """gamma: the server's γ (used when no policy decides, and for mode ON).
        eos_token_ids: every id that ends a sequence (generation_config's list, too).
        policy: plans each row's γ per round from measured costs (None = always `gamma`).
        caps: what one request may ask for (built once from config; with the models' they
        make the engine's `limits`).
        draft_ahead: draft round k + 1 while the target verifies round k (pipelined rounds;
        pays only when the verifier runs concurrently, e.g. on a remote target).
        prefill_chunk_tokens: prompt tokens read per round, over all new rows (`PrefillChunks`;
        None or 0: each prompt whole in its first round).
        grammars: compiles requests' grammars (`GrammarSpec`) for this tokenizer; None =
        requests with a grammar are refused.
        prefill_slowdown: while rows decode, the chunks of prompts longer than the budget
        lengthen their rounds by at most this share on average, measured (`PrefillPace`; the
        config's default is on; 0: every round reads its full budget)."""
        if not 0 <= gamma <= caps.gamma_limit:
            raise ValueError(f"gamma must be in [0, gamma_limit={caps.gamma_limit}], got {gamma}")
        self.verifier = verifier
        self.eos_token_ids = tuple(eos_token_ids)
        self.decode = decode
        self.caps = caps
        self.policy = policy
        self._proposer_view = ProposerView()  # what the proposer must catch up on, per row
        self.planner = RoundPlanner(gamma, caps.gamma_limit, self._proposer_view)
        self.stats = SpecStats()
        self.timer = RoundTimer()
        self.profile = self.timer.profile  # where the rounds' time went
        self.proposals = RoundProposals(proposer, self._proposer_view, self.timer, draft_ahead)
        self.grammars = grammars
        self.chunks = PrefillChunks(prefill_chunk_tokens,
                                    PrefillPace(prefill_slowdown) if prefill_slowdown > 0 else None)
        self.scheduler = Scheduler(caps.gamma_limit + 1, self.chunks.budget, self._release)
        self._finished: dict[str, Sequence] = {}
        self._ids = itertools.count()

    @property
    def proposer(self) -> Proposer:
        return self.proposals.proposer

    @proposer.setter
    def proposer(self, proposer: Proposer) -> None:
        self.proposals.proposer = proposer

    @property
    def draft_ahead(self) -> DraftAhead | None:
        """Drafting round k + 1 while the target verifies round k (None: sequential rounds)."""
        return self.proposals.draft_ahead

    @draft_ahead.setter
    def draft_ahead(self, draft_ahead: DraftAhead | None) -> None:
        self.proposals.draft_ahead = draft_ahead

    @property
    def proposer_failures(self) -> int:
        """Proposer calls that failed so far (their rounds ran without drafts)."""
        return self.proposals.failures

    @property
    def preemptions(self) -> int:
        """Running requests sent back to the queue for lack of cache, so far."""
        return self.scheduler.preemptions

    @property
    def gamma(self) -> int:
        """The server's static γ (no policy, mode ON)."""
        return self.planner.gamma

    @property
    def last_decision(self) -> Decision:
        """The last round's plan."""
        return self.planner.decision

    # ---- requests -------------------------------------------------------------------------

    @property
    def limits(self) -> RequestLimits:
        """What this engine accepts (its models, caps and proposers)."""
        return RequestLimits.of(self.caps, self.verifier.vocab_size, self.verifier.max_seq_len, self.proposer.names)

    def validate(self, request: GenerationRequest) -> None:
        """Raise ValueError (naming the field) for a request this engine cannot serve."""
        request.check_limits(self.limits)
        self._grammar_row(request)

    def _grammar_row(self, request: GenerationRequest) -> GrammarRow | None:
        """The request's grammar matcher (compiled once per distinct grammar), or None."""
        if request.grammar is None:
            return None
        if self.grammars is None:
            raise InvalidRequestError("grammar", "this server has no grammar engine")
        vocab_size = self.verifier.vocab_size
        return GrammarRow(self.grammars.matcher(request.grammar, vocab_size), vocab_size, request.grammar)

    def add_request(self, request: GenerationRequest, seq_id: str | None = None) -> str:
        """Validate and queue a request; it joins the batch at the next round."""
        self.validate(request)
        seq_id = seq_id if seq_id is not None else f"seq-{next(self._ids)}"
        if seq_id in self._finished or any(s.seq_id == seq_id for s in self.scheduler.active()):
            raise ValueError(f"seq_id {seq_id!r} is already in use")
        eos = () if request.ignore_eos else self.eos_token_ids
        checker = StopChecker(request.max_new_tokens, (*eos, *request.stop_token_ids), request.stop_strings,
                              self.decode)
        self.scheduler.waiting.append(Sequence(seq_id=seq_id, request=request, stop_checker=checker,
                                               grammar=self._grammar_row(request)))
        if self.policy is not None:
            self.policy.on_arrival()
        return seq_id

    def abort(self, seq_id: str) -> None:
        """Cancel a request: free its slots on the target and the proposer."""
        for seq in self.scheduler.active():
            if seq.seq_id == seq_id:
                seq.finish_reason = "abort"
                self._retire(seq)
                return
        raise KeyError(f"unknown or finished seq_id {seq_id!r}")

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def running_ids(self) -> list[str]:
        """The sequences of the current batch (a round that fails affects exactly these)."""
        return [s.seq_id for s in self.scheduler.running]

    def result(self, seq_id: str) -> GenerationResult:
        """The finished request's result (handed out once: the engine then forgets it).
        Raises the request's own error when it failed."""
        seq = self._finished.pop(seq_id)
        if seq.error is not None:
            raise seq.error
        asked = seq.request
        return GenerationResult(seq.seq_id, seq.output_ids, seq.stop_checker.text, seq.finish_reason or "", seq.stats,
                                queue_s=seq.queue_s, logprobs=seq.logprobs if asked.logprobs is not None else None,
                                prompt_logprobs=seq.prompt_logprobs if asked.prompt_logprobs is not None else None)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Convenience: run the given requests to completion, batched together."""
        ids = [self.add_request(r) for r in requests]
        while self.has_unfinished():
            self.step()
        return [self.result(i) for i in ids]

    # ---- one round -------------------------------------------------------------------------

    def step(self) -> list[RoundOutput]:
        """Admit waiting requests, then run one round for the running sequences (all of them;
        with micro-batches, the half whose drafts are ready)."""
        start = time.perf_counter()
        self.timer.step_started(start)
        ended = self.scheduler.admit(self.verifier)  # rows whose grant's growth raised: failed, freed
        self._finished.update((seq.seq_id, seq) for seq, _ in ended)
        failed = [output for _, output in ended]
        if not self.scheduler.running:
            self.timer.step_ended(start, busy=False)
            return failed
        batch = self.chunks.plan(self.scheduler.running, 1 + max(self.planner.decision.gammas, default=self.gamma))
        queues = (len(self.scheduler.running), len(self.scheduler.waiting))
        self.planner.plan(batch, self.policy, self.verifier.max_seq_len, queues)
        outputs = self._isolated_round(batch, whole=len(batch) == len(self.scheduler.running))
        self.scheduler.placed.update([*(o.seq_id for o in outputs), *(seq.seq_id for seq in batch if seq.prefilled)])
        elapsed = time.perf_counter() - start
        self.chunks.round_done(elapsed)
        self.stats.seconds += elapsed
        for seq in batch:
            seq.stats.seconds += elapsed
            if seq.finished:
                try:  # the round's outputs are made: a failed release must not lose them
                    self._retire(seq)
                except Exception:
                    logger.exception("releasing %s failed (its lease frees the slots)", seq.seq_id)
        self.timer.step_ended(time.perf_counter(), busy=self.has_unfinished())
        return failed + outputs

    def _isolated_round(self, batch: list[Sequence], whole: bool = False) -> list[RoundOutput]:
        """One round for the batch. When its shared part (propose + verify) fails for a
        reason a row may have caused, the batch is halved and each half retried, so only
        the rows that fail on their own fail. A failed attempt changed no history (the
        verifier and proposer resynchronise to it), so a retry is safe. whole: the batch is
        every running row (only such a round overlaps drafting with verifying)."""
        try:
            return self._round(batch, overlap=whole)  # retries run plainly
        except WorkerError:
            raise
        except Exception as exc:
            if len(batch) == 1:
                logger.warning("request %s failed: %s: %s", batch[0].seq_id, type(exc).__name__, exc)
                return [fail_row(batch[0], exc)]
            middle = len(batch) // 2
            return self._isolated_round(batch[:middle]) + self._isolated_round(batch[middle:])

    def _round(self, batch: list[Sequence], overlap: bool = True) -> list[RoundOutput]:
        """Propose, verify, apply. With draft_ahead (and overlap), the rows verified now
        use drafts made during the previous step, and the proposer works while the target
        verifies: for the other rows (two micro-batches), or ahead for these (look-ahead).
        Returns the outputs of the rows verified in this step."""
        start = time.perf_counter()
        self._proposer_view.start_round()
        filling = [seq for seq in batch if seq.chunk_end is not None]  # prefill chunks: no drafts, no output
        batch = [seq for seq in batch if seq.chunk_end is None]
        gammas = {seq.seq_id: self.planner.gamma_for(seq) for seq in batch}
        ahead = self.draft_ahead if overlap else None
        now, later = ahead.split(batch, gammas) if ahead is not None else (batch, [])
        gamma_now = [gammas[seq.seq_id] for seq in now]
        reads = self._chunk_reads(filling)
        proposal, fresh = self.proposals.ready_drafts(now, gamma_now, reads) if ahead is not None else \
            (self.proposals.propose(now, gamma_now, reads), set(range(len(now))))
        proposed = time.perf_counter()
        self.proposals.note_unavailable(now, gamma_now, proposal)
        requests = [verify_request(seq, drafts) for seq, drafts in zip(now, proposal)]
        prompts = [unread_prompt(seq) for seq in (*now, *filling)]
        prefill = (sum(1 for p in prompts if p), sum(prompts))  # (rows, tokens) of the prompts the target reads
        results, meanwhile, ahead_s = self._verify(now, requests, filling, ahead, later, gammas)
        verified = time.perf_counter()
        if meanwhile is not None:  # before _apply extends the histories the requests share
            ahead.after_verdict(later, requests, results, meanwhile)
        outputs, drafted, accepted = self._apply_all(now, requests, results)
        # drafted by this round's own call; a call that failed or missed its deadline is no
        # measure of drafting (its wait would price every later draft call) and no priced plan
        missed = [seq.stats.speculation_unavailable and g > 0 for seq, g in zip(now, gamma_now)]
        asked = [g if i in fresh and not missed[i] else 0 for i, g in enumerate(gamma_now)]
        planned_s = 0.0 if any(missed) else self.planner.planned_s(len(now) + len(filling))
        try:  # the tokens are applied: failing bookkeeping must not lose them from the outputs (a retry would)
            self._record(start, proposed, verified, ahead_s, (asked, drafted, accepted), prefill, planned_s,
                         [seq.seq_id for seq in now])
            if ahead is not None:
                ahead.round_done(sum(len(result.emitted) for result in results), time.perf_counter() - start,
                                 list(zip(gamma_now, drafted, accepted)))
        except Exception:
            logger.exception("the round's bookkeeping failed; its tokens stand")
        return outputs

    def _verify(self, now: list[Sequence], requests: list[VerifyRequest], filling: list[Sequence],
                ahead: DraftAhead | None, later: list[Sequence], gammas: dict[str, int]) -> tuple[list, object, float]:
        """The target's results for the rows verified now, in order, after it read this
        round's prefill chunks (a chunk's sampled token is dropped: its row emits nothing yet).
        With draft_ahead the proposer works while the target verifies. -> (results, what was
        drafted meanwhile or None, the seconds it took)."""
        chunks = [with_prompt_logprobs(seq, PrefillChunks.verify_request(seq)) for seq in filling]
        if ahead is not None and ahead.overlaps:  # the proposer works while the target verifies
            pending = self.verifier.verify_async(requests + chunks)
            meanwhile, ahead_s = self.proposals.during_verify(now, later, requests, gammas)
            drafted = time.perf_counter()
            results = pending.result()
            ahead.verdict_waited(ahead_s, time.perf_counter() - drafted)  # how far a look-ahead fits
        else:
            (meanwhile, ahead_s), results = (None, 0.0), self.verifier.verify(requests + chunks)
        if len(results) != len(now) + len(filling):
            raise WorkerError(f"the verifier answered {len(results)} results for {len(now) + len(filling)} rows")
        PrefillChunks.done(filling)
        collect_prompt_logprobs([*now, *filling], requests + chunks, results)
        return results[: len(now)], meanwhile, ahead_s

    def _apply_all(self, now: list[Sequence], requests: list[VerifyRequest],
                   results: list) -> tuple[list[RoundOutput], list[int], list[int]]:
        """Each row's round applied: (outputs, drafted per row, accepted per row)."""
        outputs, drafted, accepted = [], [], []
        for seq, request, result in zip(now, requests, results):
            output, (row_drafted, row_accepted) = apply_verdict(seq, request, result,
                                                                self.planner.recorded_gamma(seq), self.stats)
            outputs.append(output)
            drafted.append(row_drafted)
            accepted.append(row_accepted)
        return outputs, drafted, accepted

    def _chunk_reads(self, filling: list[Sequence]) -> list[ProposalRequest]:
        """While the round speculates, the draft reads each prefill chunk too, in the round's
        proposer call (asked for one draft, which is dropped), so its cache holds the prompt
        when the row first drafts instead of reading it whole then; a row that never drafts
        (mode OFF, or its own γ 0) is not read. A failed call costs the round its drafts, as
        any proposer failure, and leaves the draft to catch up later."""
        if not filling or not self.planner.decision.enabled:
            return []
        return [PrefillChunks.proposal_request(seq) for seq in filling
                if not never_drafts(seq.request.mode, seq.request.gamma)]

    def _record(self, start: float, proposed: float, verified: float, ahead_s: float, counts,
                prefill: tuple[int, int], planned_s: float, emitted: list[str]) -> None:
        """The round's profile and the policy's measurements. counts: each row's (asked γ,
        drafted, accepted) as three lists, asked γ 0 for rows whose drafts were made ahead;
        prefill: (rows whose prompt the target read besides, those prompts' tokens); planned_s:
        the round as the plan predicted it (0: not the plan's whole batch); emitted: the rows
        it emitted for (what they waited calibrates the plan's TPOT, `RoundTimer.row_waits`). The
        policy's draft cost is only the proposer call the round waited for before its verify:
        drafting ahead ran during the verify call, whose time (verified - proposed) covers it
        where it took longer; its round counts from where the last one ended (`RoundTimer`)."""
        verify_compute_s = getattr(self.verifier, "last_compute_s", None)
        round_s = self.timer.round_done(start, proposed, verified, ahead_s, verify_compute_s)
        waited = self.timer.row_waits(emitted, time.perf_counter())
        if self.policy is not None:
            self.policy.record(RoundSample.from_rows(*counts, proposed - start, verified - proposed, round_s, prefill,
                                                     self._proposer_view.read, planned_s,
                                                     (*waited, self.planner.decode_s)))

    def _retire(self, seq: Sequence) -> None:
        self._finished[seq.seq_id] = seq
        self._release(seq, holds_cache=self.scheduler.remove(seq))

    def _release(self, seq: Sequence, holds_cache: bool = True) -> None:
        """Forget the request's per-round state and free its cache on the target and the proposer."""
        self._proposer_view.forget(seq.seq_id)
        self.timer.forget(seq.seq_id)
        if self.draft_ahead is not None:
            self.draft_ahead.forget(seq.seq_id)
        if holds_cache:
            try:
                self.verifier.release(seq.seq_id)
            finally:  # a failing target must not leak the draft's slot
                self.proposer.release(seq.seq_id)
