"""Speculation statistics: rounds, drafted / accepted tokens, acceptance rate, mean accepted length.

The terms are defined once in `specdec/__init__.py`; this module only counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Counters for a request or a whole engine.

    rounds: verification rounds (each emits accepted tokens + one recovered/bonus token).
    drafted: drafted tokens offered for verification.
    accepted: drafted tokens the target kept.
    accepted_per_position: accepted_per_position[i] counts rounds whose i-th drafted token
        (0-based) was accepted; drafted_per_position[i] counts rounds that offered one.
    emitted: tokens kept in the output (may be fewer than accepted + rounds when a stop
        condition cut a round short).
    seconds: wall time spent in rounds.
    gamma: the γ the policy gave the last round (before a cut to the remaining budget).
    speculation_unavailable: the last round wanted drafts but its proposer could not draft
        (a draft worker down): it decoded plainly.
    cached_tokens: prompt tokens the target took from its prefix cache instead of computing
        them (OpenAI's usage.prompt_tokens_details.cached_tokens; whole blocks, so a multiple
        of cache.block_size).
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    seconds: float = 0.0
    gamma: int = 0
    speculation_unavailable: bool = False
    cached_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)

    def record_round(self, num_drafted: int, num_accepted: int, gamma: int) -> None:
        """Count one round that offered `num_drafted` tokens and kept `num_accepted` of them."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"num_accepted {num_accepted} outside [0, num_drafted={num_drafted}]")
        self.rounds += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.gamma = gamma
        self._grow(num_drafted)
        for i in range(num_drafted):
            self.drafted_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @staticmethod
    def kept_counts(num_drafted: int, num_accepted: int, num_kept: int) -> tuple[int, int]:
        """(drafted, accepted) to count for a round of which only the first num_kept
        emitted tokens stay in the output (a stop condition cut the rest away). Tokens cut
        away are not counted as accepted; when the cut falls inside the accepted tokens, the
        last kept token counts as the round's own token, so that accepted + rounds always
        equals the tokens kept (mean accepted length = kept tokens per round)."""
        if num_kept > num_accepted:
            return num_drafted, num_accepted
        return num_kept - 1, num_kept - 1

    def _grow(self, n: int) -> None:
        while len(self.drafted_per_position) < n:
            self.drafted_per_position.append(0)
            self.accepted_per_position.append(0)

    def merge(self, other: "SpecStats") -> None:
        """Add another set of counters into this one (e.g. a finished request into the engine's)."""
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.emitted += other.emitted
        self.seconds += other.seconds
        self.cached_tokens += other.cached_tokens
        self.gamma = other.gamma or self.gamma
        self._grow(len(other.drafted_per_position))
        for i, (d, a) in enumerate(zip(other.drafted_per_position, other.accepted_per_position)):
            self.drafted_per_position[i] += d
            self.accepted_per_position[i] += a

    @property
    def acceptance_rate(self) -> float:
        """α = accepted / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per round including the recovered/bonus token: (accepted + rounds) / rounds."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.emitted / self.seconds if self.seconds > 0 else 0.0

    def acceptance_by_position(self) -> list[float]:
        """P(drafted token i accepted | offered), position by position."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_per_position": list(self.accepted_per_position),
            "gamma": self.gamma,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "cached_tokens": self.cached_tokens,
        }
