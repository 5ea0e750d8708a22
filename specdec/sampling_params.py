"""Per-request sampling parameters, validated at the edge."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.counter_rng import MAX_SEED

MAX_TOP_K = 2**31 - 1  # the largest top_k (an int32 on the wire; any k >= the vocabulary means no limit)


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns target probabilities into tokens.

    temperature: 0 means greedy (argmax, no randomness); otherwise logits are divided by it
        (any finite value > 0, however small or large).
    top_k: keep the k most likely tokens (0 = no limit).
    top_p: keep the smallest set of tokens whose probability reaches top_p (1.0 = no limit).
    seed: a uint64 that keys the request's random draws (specdec.counter_rng). A sampled
        request with a seed is decoded by the drafter-invariant rule (specdec.gumbel_sampling):
        the same seed gives the same output whatever was drafted. None = a random one, and
        the standard rule.
    The same processing is applied to the target's p and the draft's q before the
    acceptance test, so the output follows the processed target distribution exactly.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an integer in [0, 2**31) (0 = no limit), got {self.top_k!r}")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
