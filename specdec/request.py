"""A generation request and its validation (bad input fails here, naming the field)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """What a caller asks for.

    prompt_token_ids: the prompt, already tokenised (non-empty).
    max_new_tokens: generated-token budget (>= 1).
    sampling: temperature / top-k / top-p / seed.
    stop: strings that end generation; the text is cut before the first one.
    gamma: γ for this request (None = the engine's; 0 = no speculation).
    ignore_eos: keep generating past the end-of-sequence token (benchmarks).
    proposer: which proposer drafts for this request ("draft", "ngram"; None = the engine's).
    mode: speculation mode: "auto" (the server's policy decides, following load), "on"
        (always speculate) or "off" (plain decoding, no draft calls).
    """

    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    gamma: int | None = None
    ignore_eos: bool = False
    proposer: str | None = None
    mode: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        if not self.prompt_token_ids:
            raise ValueError("prompt: must not be empty")
        if isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.gamma is not None and self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if self.mode not in ("auto", "on", "off"):
            raise ValueError(f"speculation mode must be auto, on or off, got {self.mode!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop: stop strings must not be empty")

    def check_limits(self, vocab_size: int, max_seq_len: int, max_new_tokens_limit: int) -> None:
        """Checks that need the model: token ids in range, prompt and budget within context."""
        bad = [t for t in self.prompt_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: ids {bad[:5]} outside the vocabulary [0, {vocab_size})")
        if self.max_new_tokens > max_new_tokens_limit:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} exceeds the limit {max_new_tokens_limit}")
        if len(self.prompt_token_ids) >= max_seq_len:
            raise ValueError(
                f"prompt: {len(self.prompt_token_ids)} tokens do not fit the context of {max_seq_len} tokens "
                "(cache.max_seq_len)"
            )
        if len(self.prompt_token_ids) + self.max_new_tokens > max_seq_len:
            raise ValueError(
                f"max_new_tokens: prompt ({len(self.prompt_token_ids)}) + max_new_tokens ({self.max_new_tokens}) "
                f"exceed the context of {max_seq_len} tokens (cache.max_seq_len)"
            )
