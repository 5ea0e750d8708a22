"""Where a round's time goes: the proposer call, the verifier call and the engine's own
bookkeeping, each call split into the worker's compute and the rest (serialisation,
transfer, queueing: the "hop"); with drafting ahead, how much proposer time overlapped
the verify call. Summed over rounds; `means_ms` gives the per-round picture
that GetStats and the serving benchmark report."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

RECENT_ROUNDS = 4096  # per-round timings kept for histograms until collected


@dataclass
class RoundProfile:
    """Seconds summed over `rounds` rounds.

    propose_s / verify_s: wall time of the proposer / verifier call as the engine saw it.
    propose_compute_s / verify_compute_s: what the worker itself spent (a remote worker
        reports it; in-process the whole call is compute).
    overlap_s: proposer time that ran while the target verified (drafting ahead), so
        bookkeeping = round - verify - (propose - overlap).
    """

    rounds: int = 0
    propose_s: float = 0.0
    propose_compute_s: float = 0.0
    verify_s: float = 0.0
    verify_compute_s: float = 0.0
    round_s: float = 0.0
    overlap_s: float = 0.0
    # (propose wall s or None when nothing was drafted, verify wall s) of recent rounds, for
    # histograms; `drain_recent` collects them
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_ROUNDS), repr=False, compare=False)

    def record(
        self, propose: tuple[float, float | None], verify: tuple[float, float | None], round_s: float,
        overlapped_s: float = 0.0,
    ) -> None:
        """propose / verify: (wall, compute or None = all of it) of this round's calls;
        overlapped_s: the part of the propose wall time spent while the verify call ran."""
        self.rounds += 1
        self.overlap_s += overlapped_s
        self.propose_s += propose[0]
        self.propose_compute_s += propose[0] if propose[1] is None else min(propose[1], propose[0])
        self.verify_s += verify[0]
        self.verify_compute_s += verify[0] if verify[1] is None else min(verify[1], verify[0])
        self.round_s += round_s
        self.recent.append((propose[0] if propose[0] > 0 else None, verify[0]))

    def means_ms(self) -> dict[str, float]:
        """Per-round means in milliseconds: draft and target compute, each call's hop, the
        engine's bookkeeping and the whole round."""
        if not self.rounds:
            return {}
        per = 1000.0 / self.rounds
        return {
            "draft_compute_ms": self.propose_compute_s * per,
            "draft_hop_ms": (self.propose_s - self.propose_compute_s) * per,
            "target_compute_ms": self.verify_compute_s * per,
            "target_hop_ms": (self.verify_s - self.verify_compute_s) * per,
            "bookkeeping_ms": (self.round_s - self.verify_s - self.propose_s + self.overlap_s) * per,
            "overlapped_ms": self.overlap_s * per,
            "round_ms": self.round_s * per,
        }

    def drain_recent(self) -> list[tuple[float | None, float]]:
        """The recent rounds' (propose s or None, verify s) since the last drain (safe while
        the engine's thread records: popleft is atomic)."""
        items = []
        while self.recent:
            items.append(self.recent.popleft())
        return items

    def to_dict(self) -> dict[str, float]:
        data = asdict(self)
        data.pop("recent")
        return data
