"""SpeculativeEngine: rounds of propose -> verify -> accept -> roll back for a batch of sequences.

The engine owns the requests (history, stop conditions, statistics) and drives two
swappable parts: a Proposer (draft model, n-gram, none) and a Verifier (the target). Both
are in-process objects here; the distributed router plugs gRPC clients of the draft worker
and the target group into the same engine. Every round shares one proposer call and one
target forward across all active sequences (continuous batching at round granularity):
waiting requests join at the next round, finished ones leave and free their cache slots.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from specdec.load_stats import RoundSample
from specdec.proposers.base import Proposal, ProposalRequest, Proposer
from specdec.request import GenerationRequest
from specdec.sequence import Sequence
from specdec.speculation_policy import Decision, SpeculationPolicy
from specdec.stats import SpecStats
from specdec.stop_conditions import StopChecker
from specdec.verifier import Verifier, VerifyRequest


@dataclass
class RoundOutput:
    """What one round confirmed for one sequence (what a stream sends to the client)."""

    seq_id: str
    new_token_ids: list[int]
    finish_reason: str | None


class RoundPolicy(Protocol):
    """Decides each round's γ (e.g. a LoadMonitor over a SpeculationPolicy) and hears the load
    and what each round cost."""

    def on_arrival(self, count: int = 1) -> None: ...

    def set_load(self, in_flight: int, queued: int) -> None: ...

    def decide(self, batch_size: int) -> Decision: ...

    def record(self, sample: RoundSample) -> None: ...


@dataclass
class GenerationResult:
    seq_id: str
    token_ids: list[int]  # generated tokens only
    text: str
    finish_reason: str
    stats: SpecStats


def round_sample(drafted: list[int], accepted: list[int], draft_s: float, verify_s: float) -> RoundSample:
    """A batched round's measurements from each row's drafted and accepted counts."""
    gamma = max(drafted, default=0)
    per_drafted = [sum(1 for d in drafted if d > i) for i in range(gamma)]
    per_accepted = [sum(1 for a in accepted if a > i) for i in range(gamma)]
    return RoundSample(len(drafted), gamma, sum(drafted), sum(accepted), draft_s, verify_s,
                       tuple(per_accepted), tuple(per_drafted))


class SpeculativeEngine:
    """Runs speculative decoding for many sequences at once on one verifier and one proposer."""

    def __init__(
        self,
        verifier: Verifier,
        proposer: Proposer,
        gamma: int,
        eos_token_ids: Seq[int] = (),
        decode: Callable[[list[int]], str] | None = None,
        max_new_tokens_limit: int = 4096,
        policy: RoundPolicy | None = None,
    ) -> None:
        """gamma: the server's γ (used when no policy decides, and for mode ON).
        policy: decides γ per round from load and measured costs (None = always `gamma`)."""
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.verifier = verifier
        self.proposer = proposer
        self.gamma = gamma
        self.eos_token_ids = tuple(eos_token_ids)
        self.decode = decode
        self.max_new_tokens_limit = max_new_tokens_limit
        self.policy = policy
        self._static_decision = Decision(gamma, gamma > 0, "static γ")
        self.last_decision = self._static_decision
        self.stats = SpecStats()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._finished: dict[str, Sequence] = {}
        self._ids = itertools.count()

    # ---- requests -------------------------------------------------------------------------

    def add_request(self, request: GenerationRequest, seq_id: str | None = None) -> str:
        """Validate and queue a request; it joins the batch at the next round."""
        request.check_limits(self.verifier.vocab_size, self.verifier.max_seq_len, self.max_new_tokens_limit)
        seq_id = seq_id if seq_id is not None else f"seq-{next(self._ids)}"
        if seq_id in self._finished or any(s.seq_id == seq_id for s in self._active()):
            raise ValueError(f"seq_id {seq_id!r} is already in use")
        checker = StopChecker(
            request.max_new_tokens, () if request.ignore_eos else self.eos_token_ids, request.stop, self.decode
        )
        self._waiting.append(Sequence(seq_id=seq_id, request=request, stop_checker=checker))
        if self.policy is not None:
            self.policy.on_arrival()
        return seq_id

    def abort(self, seq_id: str) -> None:
        """Cancel a request: free its slots on the target and the proposer."""
        for seq in self._active():
            if seq.seq_id == seq_id:
                seq.finish_reason = "abort"
                self._retire(seq)
                return
        raise KeyError(f"unknown or finished seq_id {seq_id!r}")

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def running_ids(self) -> list[str]:
        """The sequences of the current batch (a round that fails affects exactly these)."""
        return [s.seq_id for s in self._running]

    def result(self, seq_id: str) -> GenerationResult:
        """The finished request's result (handed out once: the engine then forgets it)."""
        seq = self._finished.pop(seq_id)
        text = self.decode(seq.output_ids) if self.decode else ""
        if seq.request.stop:
            text = seq.stop_checker.text_before_stop(text)
        return GenerationResult(seq.seq_id, seq.output_ids, text, seq.finish_reason or "", seq.stats)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Convenience: run the given requests to completion, batched together."""
        ids = [self.add_request(r) for r in requests]
        while self.has_unfinished():
            self.step()
        return [self.result(i) for i in ids]

    # ---- one round -------------------------------------------------------------------------

    def step(self) -> list[RoundOutput]:
        """Admit waiting requests, then run one round for every running sequence."""
        start = time.perf_counter()
        self._admit()
        if not self._running:
            return []
        batch = list(self._running)
        if self.policy is not None:
            self.policy.set_load(len(self._running), len(self._waiting))
            self.last_decision = self.policy.decide(len(batch))
        gammas = [self._gamma_for(s) for s in batch]
        proposed = time.perf_counter()
        proposal = self._propose(batch, gammas)
        verified = time.perf_counter()
        outputs, accepted = self._verify(batch, proposal)
        elapsed = time.perf_counter() - start
        if self.policy is not None:
            drafted = proposal.num_drafted.tolist()
            self.policy.record(round_sample(drafted, accepted, verified - proposed, elapsed - (verified - start)))
        self.stats.seconds += elapsed
        for seq in batch:
            seq.stats.seconds += elapsed
            if seq.finished:
                self._retire(seq)
        return outputs

    def _admit(self) -> None:
        """Waiting requests join while the verifier has free slots (running ones hold theirs)."""
        free = self.verifier.num_free_slots
        while self._waiting and free > 0:
            self._running.append(self._waiting.popleft())
            free -= 1

    def _active(self) -> list[Sequence]:
        return [*self._waiting, *self._running]

    def _policy_gamma(self, seq: Sequence) -> int:
        """The γ the policy gives this sequence now. A seeded sampled request keeps the static
        γ: its tokens depend on the speculation schedule, so the same seed must see the same one."""
        request = seq.request
        pinned = request.sampling.seed is not None and not request.sampling.is_greedy
        decision = self._static_decision if pinned else self.last_decision
        return SpeculationPolicy.gamma_for_request(decision, request.mode, request.gamma, self.gamma)

    def _gamma_for(self, seq: Sequence) -> int:
        """This round's γ: the policy's, cut so a round never drafts past max_new_tokens."""
        return max(0, min(self._policy_gamma(seq), seq.remaining - 1))

    def _propose(self, batch: list[Sequence], gammas: list[int]) -> Proposal:
        """One proposer call for the rows that speculate; rows padded to the batch's γ."""
        gamma = max(gammas)
        full = Proposal.empty(len(batch), gamma)
        rows = [i for i, g in enumerate(gammas) if g > 0]
        if not rows:
            return full
        part = self.proposer.propose(
            [
                ProposalRequest(batch[i].seq_id, batch[i].token_ids, batch[i].request.sampling, batch[i].request.proposer)
                for i in rows
            ],
            gamma,
        )
        width = part.token_ids.shape[1]
        for j, i in enumerate(rows):
            full.token_ids[i, :width] = part.token_ids[j]
            full.num_drafted[i] = min(int(part.num_drafted[j]), gammas[i])
        if part.probs is not None:
            full.probs = part.probs.new_zeros(len(batch), gamma, part.probs.shape[-1])
            full.probs[rows, :width] = part.probs
        return full

    def _verify(self, batch: list[Sequence], proposal: Proposal) -> tuple[list[RoundOutput], list[int]]:
        """One verifier call over every row, then record statistics and apply stop conditions.
        Returns the round's outputs and each row's number of accepted tokens."""
        requests = []
        for i, seq in enumerate(batch):
            drafted = proposal.drafted(i)
            probs = proposal.probs[i, : len(drafted)] if proposal.probs is not None and drafted else None
            requests.append(VerifyRequest(seq.seq_id, seq.token_ids, drafted, seq.request.sampling, probs))
        outputs, accepted = [], []
        for seq, request, result in zip(batch, requests, self.verifier.verify(requests)):
            gamma = self._policy_gamma(seq)  # reported uncut: the last round is usually cut short
            for stats in (seq.stats, self.stats):
                stats.record_round(len(request.draft_token_ids), result.num_accepted, gamma)
            outputs.append(self._append(seq, result.emitted))
            accepted.append(result.num_accepted)
        return outputs, accepted

    def _append(self, seq: Sequence, emitted: list[int]) -> RoundOutput:
        """Add a round's tokens to a sequence, cut at the first stop condition."""
        before = len(seq.output_ids)
        seq.token_ids.extend(emitted)
        decision = seq.stop_checker.check(seq.output_ids, len(emitted))
        del seq.token_ids[seq.num_prompt_tokens + decision.num_tokens :]
        seq.finish_reason = decision.finish_reason
        new = seq.output_ids[before:]
        seq.stats.emitted += len(new)
        self.stats.emitted += len(new)
        return RoundOutput(seq.seq_id, new, seq.finish_reason)

    def _retire(self, seq: Sequence) -> None:
        self._finished[seq.seq_id] = seq
        if seq in self._waiting:
            self._waiting.remove(seq)
        if seq in self._running:
            self._running.remove(seq)
            try:
                self.verifier.release(seq.seq_id)
            finally:  # a failing target must not leak the draft's slot
                self.proposer.release(seq.seq_id)
