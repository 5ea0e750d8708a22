"""RoundTimer: a round's timings, for the engine's profile and for its round policy.

The profile (`RoundProfile`) says where a round's time went: the proposer call, the
verifier call, bookkeeping. The policy's cost model needs what a round costs the loop:
from where the last round ended, while rows kept running, to this round's end. That lead
(handing the outputs to the streams, admitting, planning) is paid by every round and is a
sizeable share of a short plain one; left out, plain decoding would look cheaper than it
is. A pause with nothing running costs nothing.

A row's time per output token holds more than its rounds: the rounds that read other rows'
prompts, rounds it sits out (a prefill chunk's budget, the other micro-batch's turn). So
the timer also keeps when each row last emitted (`row_waits`): what a row waited between two
emissions is what its time per output token is made of, and the policy's TPOT prediction
is calibrated on it (`RoundCostModel.wait_scale`).
"""

from __future__ import annotations

import time

from specdec.round.round_profile import RoundProfile


class RoundTimer:
    """Times the engine's steps and rounds (perf_counter seconds)."""

    def __init__(self) -> None:
        self.profile = RoundProfile()
        self.propose_compute_s: float | None = 0.0  # this round's proposer compute (None: not reported)
        self._ended_at: float | None = None  # when the last step ended, while rows kept running
        self._lead_from: float | None = None  # where this step's policy timing starts
        self._emitted_at: dict[str, float] = {}  # seq id -> when its last round ended (rows that emitted)

    def step_started(self, now: float) -> None:
        self._lead_from = now if self._ended_at is None else self._ended_at

    def step_ended(self, now: float, busy: bool) -> None:
        """busy: rows still running or waiting (the loop goes straight on to the next step)."""
        self._ended_at = now if busy else None

    def add_propose_compute(self, wall: float, compute: float | None) -> None:
        """Add a proposer call's compute (its wall time when the proposer reports none)."""
        if self.propose_compute_s is None and compute is None:
            return
        self.propose_compute_s = (self.propose_compute_s or 0.0) + (wall if compute is None else compute)

    def round_done(self, start: float, proposed: float, verified: float, ahead_s: float,
                   verify_compute_s: float | None) -> float:
        """Profile a round (start → proposer call done → verify done → now; ahead_s: proposer
        time spent while the target verified). Returns the seconds the policy charges it: from
        this step's lead (the first round of a step; a retried half counts from its own start)."""
        end = time.perf_counter()
        self.profile.record((proposed - start + ahead_s, self.propose_compute_s),
                            (verified - proposed, verify_compute_s), end - start, overlapped_s=ahead_s)
        lead_from, self._lead_from = self._lead_from if self._lead_from is not None else start, None
        return end - lead_from

    def row_waits(self, seq_ids: list[str], now: float) -> tuple[int, float]:
        """Rows `seq_ids` emitted at `now`: (how many had emitted before, the seconds they
        waited since then in all). A row's first emission starts its clock (its time to first
        token is not a time per output token)."""
        rows, waited = 0, 0.0
        for seq_id in seq_ids:
            last = self._emitted_at.get(seq_id)
            if last is not None:
                rows, waited = rows + 1, waited + now - last
            self._emitted_at[seq_id] = now
        return rows, waited

    def forget(self, seq_id: str) -> None:
        """A row left the engine: its clock stops."""
        self._emitted_at.pop(seq_id, None)
