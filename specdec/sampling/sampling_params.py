"""Per-request sampling parameters, validated at the edge."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.sampling.counter_rng import MAX_SEED

MAX_TOP_K = 2**31 - 1  # the largest top_k (an int32 on the wire; any k >= the vocabulary means no limit)
MAX_LOGIT_BIAS = 300  # the most logit_bias entries (OpenAI's cap), so a row's processing stays small
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 on the wire


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns target probabilities into tokens.

    temperature: 0 means greedy (argmax, no randomness); otherwise logits are divided by it
        (any finite value > 0, however small or large).
    top_k: keep the k most likely tokens (0 = no limit).
    top_p: keep the smallest set of tokens whose probability reaches top_p (1.0 = no limit).
    seed: a uint64 that keys the request's random draws (specdec.sampling.counter_rng). A sampled
        request with a seed is decoded by the drafter-invariant rule (specdec.sampling.gumbel_sampling):
        the same seed gives the same output whatever was drafted. None = a random one, and
        the standard rule.
    min_p: after temperature, drop the tokens less likely than min_p times the most likely
        one, in [0, 1] (0 = off; applied after top-k and top-p, as transformers does).
    presence_penalty / frequency_penalty: in [-2, 2] (OpenAI): subtract penalty * [count > 0]
        / penalty * count from the logit of each token occurring count times in the output.
    repetition_penalty: > 0 (transformers / vLLM; 1 = off): the logit of every token in the
        prompt or the output is divided by it when positive, multiplied by it otherwise.
    logit_bias: ((token id, bias), ...) added to the raw logits, bias in [-100, 100], at
        most MAX_LOGIT_BIAS distinct ids (a dict is accepted and stored sorted).
    Penalties and bias see the tokens before each position (specdec.sampling.logits_processors).
    The same processing is applied to the target's p and the draft's q before the
    acceptance test, so the output follows the processed target distribution exactly.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an integer in [0, 2**31) (0 = no limit), got {self.top_k!r}")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        self._check_processing()

    def _check_processing(self) -> None:
        """Validate min_p, the penalties and logit_bias (stored as sorted pairs)."""
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or r <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {r!r}")
        object.__setattr__(self, "logit_bias", _checked_bias(self.logit_bias))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _checked_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs, or ValueError naming what is wrong."""
    if not isinstance(bias, (dict, tuple, list)):
        raise ValueError(f"logit_bias: must map token ids to biases, got {type(bias).__name__}")
    pairs = list(bias.items()) if isinstance(bias, dict) else list(bias)
    if len(pairs) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias: {len(pairs)} entries, at most {MAX_LOGIT_BIAS} are allowed")
    checked = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"logit_bias: entries must be (token id, bias) pairs, got {pair!r}")
        token, value = pair
        if not _is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
            raise ValueError(f"logit_bias: token ids must be integers in [0, 2**31), got {token!r}")
        if not _is_real(value) or not -100.0 <= value <= 100.0:
            raise ValueError(f"logit_bias: values must be in [-100, 100], got {value!r} for token {token}")
        if token in checked:
            raise ValueError(f"logit_bias: names token {token} twice")
        checked[token] = float(value)
    return tuple(sorted(checked.items()))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
