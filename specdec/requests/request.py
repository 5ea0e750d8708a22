"""A generation request, its contract with the server, and its validation (bad input fails
here, naming the field).

The rules live here once: `check_speculation` (mode, γ, proposer name) and
`GenerationRequest.__post_init__` check what needs nothing but the request (a protocol shell
may call `check_speculation` on its own fields too, for an early 400), and `check_limits`
checks it against the server (`RequestLimits`: the configured `RequestCaps`, built once from
config, plus the model's vocabulary, context and the proposers loaded). Every bound here
exists so that one request's work per round stays small whatever it asks for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from specdec.proposers import proposer_registry as registry
from specdec.config.config import SpecdecConfig
from specdec.requests.errors import InvalidRequestError
from specdec.requests.grammar_spec import GrammarSpec
from specdec.sampling.sampling_params import SamplingParams
from specdec.requests.speculation_mode import SpeculationMode
from specdec.sampling.token_logprobs import MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class RequestCaps:
    """The configured caps on what one request may ask for.

    max_new_tokens_limit: the largest max_new_tokens (generation.max_new_tokens_limit).
    gamma_limit: the largest per-request γ (speculation.gamma_limit).
    max_stop_strings / max_stop_string_chars: how many stop strings (and stop token ids),
        and how long each (generation.*).
    """

    max_new_tokens_limit: int
    gamma_limit: int
    max_stop_strings: int
    max_stop_string_chars: int

    @classmethod
    def from_config(cls, config: SpecdecConfig) -> "RequestCaps":
        generation = config.generation
        return cls(generation.max_new_tokens_limit, config.speculation.gamma_limit, generation.max_stop_strings,
                   generation.max_stop_string_chars)


DEFAULT_CAPS = RequestCaps.from_config(SpecdecConfig())  # the schema's defaults (configs/default.yaml)


@dataclass(frozen=True)
class RequestLimits(RequestCaps):
    """What a server accepts: its caps, plus its models.

    vocab_size / max_seq_len: the target's vocabulary and context (cache.max_seq_len).
    proposers: the proposer names loaded here (a request may name one of them).
    """

    vocab_size: int
    max_seq_len: int
    proposers: tuple[str, ...] = ()

    @classmethod
    def of(cls, caps: RequestCaps, vocab_size: int, max_seq_len: int, proposers: tuple[str, ...]) -> "RequestLimits":
        return cls(**asdict(caps), vocab_size=vocab_size, max_seq_len=max_seq_len, proposers=tuple(proposers))


def check_speculation(mode: object, gamma: object, proposer: object,
                      tpot_target_ms: object = None) -> SpeculationMode:
    """A request's own speculation fields: the mode (returned parsed), γ >= 0 (None = the
    server's), a proposer name requests may pick (None = the server's), a positive finite
    TPOT target in ms (None = the server's). InvalidRequestError naming the field otherwise."""
    target_ok = tpot_target_ms is None or (isinstance(tpot_target_ms, (int, float)) and not isinstance(
        tpot_target_ms, bool) and math.isfinite(tpot_target_ms) and tpot_target_ms > 0)
    if not target_ok:
        raise InvalidRequestError("speculation.tpot_target_ms",
                                  f"must be a positive, finite number of milliseconds, got {tpot_target_ms!r}")
    if gamma is not None and (not _is_int(gamma) or gamma < 0):
        raise InvalidRequestError("speculation.gamma", f"must be an integer >= 0, got {gamma!r}")
    if proposer is not None and proposer not in registry.REQUESTABLE:
        raise InvalidRequestError(
            "speculation.proposer", f"unknown proposer {proposer!r} (one of {', '.join(registry.REQUESTABLE)})"
        )
    return SpeculationMode.parse(mode)


@dataclass(frozen=True)
class GenerationRequest:
    """What a caller asks for.

    prompt_token_ids: the prompt, already tokenised (non-empty).
    max_new_tokens: generated-token budget (>= 1).
    sampling: temperature / top-k / top-p / seed.
    stop: strings that end generation; the text is cut before the first one (the client's:
        the caps, generation.max_stop_strings / max_stop_string_chars, bound these).
    server_stop: stop strings the server adds for its own reasons (the end of the first tool
        call, when a request allows one call only): applied as `stop`, but not counted against
        the caps, which bound what a client sends.
    stop_token_ids: token ids that end generation like the end-of-sequence token (kept in
        the output, finish reason "stop"), besides the model's own EOS ids.
    gamma: γ for this request (None = the engine's; 0 = no speculation).
    ignore_eos: keep generating past the model's end-of-sequence tokens (benchmarks).
    proposer: which proposer drafts for this request ("draft", "ngram"; None = the engine's).
    mode: the speculation mode (`SpeculationMode`; its name is accepted too).
    tpot_target_ms: the request's time-per-output-token target, milliseconds (None = the
        server's, load_monitor.tpot_target_ms): the policy plans within it (docs/goodput.md).
    logprobs: report each generated token's logprob and this many most likely alternatives
        (0..MAX_TOP_LOGPROBS; None = no logprobs): specdec.sampling.token_logprobs.
    grammar: the output must match it (None = free text): it masks the target's distribution
        at every position, and the grammar's end ends the output (docs/structured_output.md).
    prompt_logprobs: report each prompt token's logprob under the target given the tokens
        before it (the first has none) and this many alternatives (0..MAX_TOP_LOGPROBS;
        None = none): GenerationResult.prompt_logprobs.
    """

    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    gamma: int | None = None
    ignore_eos: bool = False
    proposer: str | None = None
    mode: SpeculationMode = SpeculationMode.AUTO
    tpot_target_ms: float | None = None
    logprobs: int | None = None
    grammar: GrammarSpec | None = None
    prompt_logprobs: int | None = None
    server_stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", _int_tuple(self.prompt_token_ids, "prompt_token_ids"))
        object.__setattr__(self, "stop_token_ids", _int_tuple(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "server_stop", tuple(self.server_stop))
        if not self.prompt_token_ids:
            raise InvalidRequestError("prompt", "must not be empty")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise InvalidRequestError("max_new_tokens", f"must be >= 1, got {self.max_new_tokens!r}")
        object.__setattr__(self, "mode", check_speculation(self.mode, self.gamma, self.proposer, self.tpot_target_ms))
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_TOP_LOGPROBS):
                raise InvalidRequestError(name, f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise InvalidRequestError("stop", "stop strings must be non-empty strings")
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise InvalidRequestError("grammar", f"must be a GrammarSpec, got {type(self.grammar).__name__}")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Every stop string that ends this request: the client's, then the server's."""
        return self.stop + self.server_stop

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
        if self.gamma is not None and self.gamma > limits.gamma_limit:
            raise ValueError(
                f"speculation.gamma {self.gamma} exceeds the limit {limits.gamma_limit} (speculation.gamma_limit)"
            )
        self.check_proposer(limits.proposers)
        self._check_stop(limits)

    def check_proposer(self, available: tuple[str, ...]) -> None:
        """The proposer the request names (if any) is one of those loaded here."""
        if self.proposer is not None and self.proposer not in available:
            raise InvalidRequestError(
                "speculation.proposer", f"{self.proposer!r} is not available here (have {list(available)})"
            )

    def _check_tokens(self, limits: RequestLimits) -> None:
        for name, ids in (("prompt_token_ids", self.prompt_token_ids), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if not 0 <= t < limits.vocab_size]
            if bad:
                raise ValueError(f"{name}: ids {bad[:5]} outside the vocabulary [0, {limits.vocab_size})")
        biased = [t for t, _ in self.sampling.logit_bias if t >= limits.vocab_size]
        if biased:
            raise ValueError(f"logit_bias: ids {biased[:5]} outside the vocabulary [0, {limits.vocab_size})")
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
        raise InvalidRequestError(name, "token ids must be integers")
    return tuple(int(v) for v in values)
