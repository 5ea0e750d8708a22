"""A generation request and its validation (bad input fails here, naming the field).

Validation happens in two steps, both before the request touches any shared state:
`GenerationRequest.__post_init__` checks what needs nothing but the request, and
`check_limits` checks it against the server (`RequestLimits`: vocabulary, context, the
configured caps and the proposers loaded). Every bound here exists so that one request's
work per round stays small whatever it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.sampling_params import SamplingParams
from specdec.token_logprobs import MAX_TOP_LOGPROBS

MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class RequestLimits:
    """What a server accepts (its models and its configured caps).

    vocab_size / max_seq_len: the target's vocabulary and context (cache.max_seq_len).
    max_new_tokens_limit: the largest max_new_tokens.
    gamma_max: the largest per-request γ (speculation.gamma_max).
    max_stop_strings / max_stop_string_chars: how many stop strings, and how long each.
    proposers: the proposer names loaded here (a request may name one of them).
    """

    vocab_size: int
    max_seq_len: int
    max_new_tokens_limit: int = 4096
    gamma_max: int = 16
    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    proposers: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """What a caller asks for.

    prompt_token_ids: the prompt, already tokenised (non-empty).
    max_new_tokens: generated-token budget (>= 1).
    sampling: temperature / top-k / top-p / seed.
    stop: strings that end generation; the text is cut before the first one.
    stop_token_ids: token ids that end generation like the end-of-sequence token (kept in
        the output, finish reason "stop"), besides the model's own EOS ids.
    gamma: γ for this request (None = the engine's; 0 = no speculation).
    ignore_eos: keep generating past the model's end-of-sequence tokens (benchmarks).
    proposer: which proposer drafts for this request ("draft", "ngram"; None = the engine's).
    mode: speculation mode: "auto" (the server's policy decides, following load), "on"
        (always speculate) or "off" (plain decoding, no draft calls).
    logprobs: report each generated token's logprob and this many most likely alternatives
        (0..MAX_TOP_LOGPROBS; None = no logprobs): specdec.token_logprobs.
    """

    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    gamma: int | None = None
    ignore_eos: bool = False
    proposer: str | None = None
    mode: str = "auto"
    logprobs: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", _int_tuple(self.prompt_token_ids, "prompt_token_ids"))
        object.__setattr__(self, "stop_token_ids", _int_tuple(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "stop", tuple(self.stop))
        if not self.prompt_token_ids:
            raise ValueError("prompt: must not be empty")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if self.gamma is not None and (not _is_int(self.gamma) or self.gamma < 0):
            raise ValueError(f"speculation.gamma must be >= 0, got {self.gamma!r}")
        if self.mode not in MODES:
            raise ValueError(f"speculation.mode must be auto, on or off, got {self.mode!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop: stop strings must be non-empty strings")

    def check_limits(self, limits: RequestLimits) -> None:
        """Checks that need the server: ids in range, context, caps, proposer loaded."""
        self._check_tokens(limits)
        if self.max_new_tokens > limits.max_new_tokens_limit:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} exceeds the limit {limits.max_new_tokens_limit}")
        if len(self.prompt_token_ids) + self.max_new_tokens > limits.max_seq_len:
            raise ValueError(
                f"max_new_tokens: prompt ({len(self.prompt_token_ids)}) + max_new_tokens ({self.max_new_tokens}) "
                f"exceed the context of {limits.max_seq_len} tokens (cache.max_seq_len)"
            )
        if self.gamma is not None and self.gamma > limits.gamma_max:
            raise ValueError(
                f"speculation.gamma {self.gamma} exceeds the limit {limits.gamma_max} (speculation.gamma_max)"
            )
        if self.proposer is not None and self.proposer not in limits.proposers:
            raise ValueError(
                f"speculation.proposer: {self.proposer!r} is not available here (have {list(limits.proposers)})"
            )
        self._check_stop(limits)

    def _check_tokens(self, limits: RequestLimits) -> None:
        for name, ids in (("prompt_token_ids", self.prompt_token_ids), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if not 0 <= t < limits.vocab_size]
            if bad:
                raise ValueError(f"{name}: ids {bad[:5]} outside the vocabulary [0, {limits.vocab_size})")
        if len(self.prompt_token_ids) >= limits.max_seq_len:
            raise ValueError(
                f"prompt: {len(self.prompt_token_ids)} tokens do not fit the context of {limits.max_seq_len} tokens "
                "(cache.max_seq_len)"
            )
        if len(self.stop_token_ids) > limits.max_stop_strings:
            raise ValueError(
                f"stop_token_ids: {len(self.stop_token_ids)} ids exceed the limit {limits.max_stop_strings}"
            )

    def _check_stop(self, limits: RequestLimits) -> None:
        if len(self.stop) > limits.max_stop_strings:
            raise ValueError(f"stop: {len(self.stop)} stop strings exceed the limit {limits.max_stop_strings}")
        longest = max((len(s) for s in self.stop), default=0)
        if longest > limits.max_stop_string_chars:
            raise ValueError(
                f"stop: a stop string of {longest} characters exceeds the limit {limits.max_stop_string_chars}"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(values, name: str) -> tuple[int, ...]:
    values = tuple(values)
    if not all(_is_int(v) or (hasattr(v, "__index__") and not isinstance(v, bool)) for v in values):
        raise ValueError(f"{name}: token ids must be integers")
    return tuple(int(v) for v in values)
