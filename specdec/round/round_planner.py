"""RoundPlanner: each row's γ for one round of the engine.

The policy (`specdec.policy.speculation_policy.RoundPolicy`) plans every row's γ from what it
sees of the row (`RowState`); without a policy, or when it fails, every row gets the static γ
(`fixed_plan`). Either way a row never drafts past its cap: its max_new_tokens and the
target's context. A failing policy costs the round its plan, never a request.

The goodput plan costs CPU (a fraction of a millisecond at 32 rows) that the round would
wait for. So with a policy that can plan ahead (`LoadMonitor.plan_ahead`), each round's plan
also starts the next one on a worker thread, from what is known before this round's verdict
(the rows and their counts as planned now, their prompts read): it runs while the engine
thread waits for the proposer and the target (the GIL is free then). The next round takes
it while speculation is still on and at most MOST_NEWCOMERS of its rows joined since: rows
that finished drop out, and a newcomer drafts what the plan gave most rows
(`specdec.policy.ahead_plan`; under load rows finish and join in most rounds, and
planning in place whenever one did would plan twice in most rounds). The round's
overrides, caps, exploration and predicted seconds are still its own
(`SpeculationPolicy.plan`). What lags is one round of the rows' acceptance counts, which a
row's prior of hundreds of drafted tokens outweighs.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from specdec.policy.ahead_plan import NEWCOMER
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import Decision, RoundPolicy, fixed_plan
from specdec.proposers.proposer_view import ProposerView
from specdec.requests.sequence import Sequence

logger = logging.getLogger(__name__)
MOST_NEWCOMERS = 0.25  # a plan made ahead is taken while at most this share of the round's rows joined since


def unread_prompt(seq: Sequence) -> int:
    """Tokens the target reads for a row besides its γ + 1: its prompt, in its first round
    (less what earlier prefill chunks read; a chunk's part only in a prefill chunk's round)."""
    if seq.stats.rounds > 0:
        return 0
    end = len(seq.token_ids) if seq.chunk_end is None else seq.chunk_end
    return end - 1 - seq.prefilled


@dataclass
class PlanningTime:
    """The plan's seconds so far: on the round's critical path (the engine thread, from the
    rows' states to the plan taken) and on the worker thread (plans made ahead)."""

    rounds: int = 0  # rounds planned
    taken: int = 0  # ... of which took the plan made ahead
    critical_s: float = 0.0
    ahead_s: float = 0.0

    def per_round_ms(self) -> dict[str, float]:
        """Milliseconds per round on the critical path and ahead, and the share of rounds
        that took the plan made ahead."""
        per = 1000.0 / max(1, self.rounds)
        return {"plan_critical_ms": self.critical_s * per, "plan_ahead_ms": self.ahead_s * per,
                "plan_taken_ahead": self.taken / max(1, self.rounds)}


class RoundPlanner:
    """Plans a round's γ per row and remembers the plan until the next one."""

    def __init__(self, gamma: int, gamma_limit: int, proposer_view: ProposerView) -> None:
        """gamma: the static γ (no policy, mode ON); gamma_limit: no row drafts more (speculation.gamma_limit);
        proposer_view: what the proposer must catch up on per row (the policy prices it)."""
        self.gamma, self.gamma_limit = gamma, gamma_limit
        self.decision = Decision(gamma, gamma > 0, "static γ")  # the last round's
        self._proposer_view = proposer_view
        self._planned: dict[str, int] = {}  # seq id -> its γ this round
        self._caps: dict[str, int] = {}  # seq id -> the most γ it could draft this round
        self._ahead: Future | None = None  # the next round's plan, made while this round runs
        self._pool: ThreadPoolExecutor | None = None  # one worker thread, started with the first plan ahead
        self.planning = PlanningTime()

    def plan(self, batch: list[Sequence], policy: RoundPolicy | None, max_seq_len: int,
             load: tuple[int, int]) -> None:
        """Each row's γ this round: the policy's plan (or the static γ), within the row's cap.
        load: (requests running, requests waiting), which the policy is told first."""
        started = time.perf_counter()
        caps = [self.cap(seq, max_seq_len) for seq in batch]
        decision = rows = None  # without a policy, nothing reads the rows' states (`RowState`)
        if policy is not None:
            rows = [self.row_state(seq, max_seq_len) for seq in batch]
            decision = self._policy_plan(policy, rows, load)
        if decision is None:  # no policy, or it failed
            decision = fixed_plan([(seq.request.mode, seq.request.gamma) for seq in batch], self.gamma)
        self.decision = decision
        self._planned = {seq.seq_id: max(0, min(g, cap)) for seq, cap, g in zip(batch, caps, decision.gammas)}
        self._caps = {seq.seq_id: cap for seq, cap in zip(batch, caps)}
        if rows is not None and decision.catch_up and hasattr(policy, "plan_ahead"):
            self._ahead = self._start_pool().submit(self._plan_ahead, policy, rows)
        self.planning.critical_s += time.perf_counter() - started
        self.planning.rounds += 1

    def _policy_plan(self, policy: RoundPolicy, rows: list[RowState], load: tuple[int, int]) -> Decision | None:
        """The policy's plan for the rows, told the load first; None where it failed (a failing
        policy costs the round its plan, the static γ, never a request)."""
        try:
            policy.set_load(*load)
            planned = self._planned_by(policy, rows)
            if len(planned.gammas) != len(rows):
                raise ValueError(f"the policy planned {len(planned.gammas)} rows for a batch of {len(rows)}")
            return planned
        except Exception:
            logger.exception("the round policy failed; this round uses the static γ")
            return None

    def _planned_by(self, policy: RoundPolicy, rows: list[RowState]) -> Decision:
        """The policy's plan for these rows: the one made ahead where it covers them all
        (in their order), else made now."""
        ahead = self._take_ahead(rows)
        if ahead is None:
            return policy.plan(rows, self.gamma)
        self.planning.taken += 1
        return policy.plan(rows, self.gamma, ahead=ahead)

    def _take_ahead(self, rows: list[RowState]) -> Decision | None:
        """The plan made ahead, for these rows in their order (NEWCOMER for a row not in it);
        None where there is none, it failed, or too many rows joined since it was made."""
        pending, self._ahead = self._ahead, None
        if pending is None:
            return None
        try:
            ahead, ids, seconds = pending.result()
        except Exception:
            logger.exception("planning ahead failed; this round is planned in place")
            return None
        self.planning.ahead_s += seconds
        where = {seq_id: i for i, seq_id in enumerate(ids)}
        pick = [where.get(row.seq_id) for row in rows]
        if len(ahead.catch_up) != len(ids) or MOST_NEWCOMERS * len(rows) < sum(i is None for i in pick):
            return None
        return replace(ahead, gammas=tuple(NEWCOMER if i is None else ahead.gammas[i] for i in pick),
                       catch_up=tuple(0.0 if i is None else ahead.catch_up[i] for i in pick))

    def _plan_ahead(self, policy: RoundPolicy, rows: list[RowState]) -> tuple[Decision, list[str], float]:
        """The next round's plan for these rows (on the worker thread), their prompts read:
        (the plan, the rows' ids in its order, the seconds it took)."""
        started = time.perf_counter()
        ahead = policy.plan_ahead([replace(row, prompt_tokens=0) if row.prompt_tokens else row for row in rows],
                                  self.gamma)
        return ahead, [row.seq_id for row in rows], time.perf_counter() - started

    def _start_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-plan-ahead")
        return self._pool

    def row_state(self, seq: Sequence, max_seq_len: int) -> RowState:
        """What the policy sees of a row. Its cap keeps a round from drafting past
        max_new_tokens or the target's context (down to 0: plain decoding for this row). A
        seeded sampled request is planned like any other: its tokens do not depend on the
        speculation schedule (specdec.sampling.gumbel_sampling)."""
        request, stats = seq.request, seq.stats
        target = request.tpot_target_ms
        return RowState(request.mode, request.gamma, self.cap(seq, max_seq_len), stats.drafted, stats.accepted,
                        seq.seq_id, unread_prompt(seq), self._proposer_view.catch_up(seq.seq_id, len(seq.token_ids)),
                        seq.remaining, tuple(stats.drafted_per_position),
                        None if target is None else target / 1000.0)

    def cap(self, seq: Sequence, max_seq_len: int) -> int:
        """The most γ a row may draft this round: not past its max_new_tokens, the target's
        context or the γ limit (0 for a prefill chunk)."""
        if seq.chunk_end is not None:  # a prefill chunk drafts nothing
            return 0
        return max(0, min(self.gamma_limit, seq.remaining - 1, max_seq_len - len(seq.token_ids)))

    def gamma_for(self, seq: Sequence) -> int:
        """This round's planned γ for a row of the batch (0 for a row not in it)."""
        return self._planned.get(seq.seq_id, 0)

    def recorded_gamma(self, seq: Sequence) -> int:
        """The γ a row's statistics record for this round: the planned one, except where its
        cap cut it short (its last rounds), which keeps the last uncut γ."""
        gamma = self.gamma_for(seq)
        if gamma == self._caps.get(seq.seq_id) < self.gamma_limit:
            return seq.stats.gamma
        return gamma

    def planned_s(self, rows: int) -> float:
        """The round's time as the plan predicted it, for a round of `rows` rows: 0 unless
        they are the plan's whole batch (a micro-batch or a retried half is another round)."""
        return self.decision.planned_s if rows == len(self._planned) else 0.0

    @property
    def decode_s(self) -> float:
        """The plan's decoding round as its TPOT prediction priced it (0: not priced), for
        any of its rows' rounds: a micro-batch's rows wait for the other half too, and the
        plan priced the batch as one round."""
        return self.decision.decode_s
