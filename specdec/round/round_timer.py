"""RoundTimer: a round's timings, for the engine's profile and for its round policy.

The profile (`RoundProfile`) says where a round's time went: the proposer call, the
verifier call, bookkeeping. The policy's cost model needs what a round costs the loop:
from where the last round ended, while rows kept running, to this round's end. That lead
(handing the outputs to the streams, admitting, planning) is paid by every round and is a
sizeable share of a short plain one; left out, plain decoding would look cheaper than it
is. A pause with nothing running costs nothing.
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
