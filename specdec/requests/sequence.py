"""The engine's per-request state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specdec.requests.request import GenerationRequest
from specdec.requests.stats import SpecStats
from specdec.requests.stop_conditions import StopChecker
from specdec.sampling.grammar_row import GrammarRow
from specdec.sampling.token_logprobs import TokenLogprob


@dataclass
class Sequence:
    """A request being decoded.

    token_ids is the history: prompt + generated. The last token is the *pending* token:
    emitted, and fed to the target at the start of the next round. The caller's history is
    the source of truth that the verifier and the proposer synchronise to.
    """

    seq_id: str
    request: GenerationRequest
    stop_checker: StopChecker
    token_ids: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None
    error: BaseException | None = None  # why the request failed (finish_reason "error")
    queued_at: float = field(default_factory=time.monotonic)  # when it was added (time.monotonic)
    started_at: float | None = None  # when it left the queue for its first round
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, when asked for
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per prompt token read so far, when asked
    prefilled: int = 0  # history tokens the target read in prefill chunks before the first round
    chunk_end: int | None = None  # this round reads the history up to here only (a prefill chunk); None = all
    grammar: GrammarRow | None = None  # the request's grammar matcher (request.grammar set), at the history's end
    granted_tokens: int | None = None  # the cache reserve the engine granted so far (None: the full reserve)
    preempted: bool = False  # its cache was freed once for others; its history is read again (its own blocks)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.request.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def prompt_logprobs_wanted(self) -> int | None:
        """How many alternatives the target still reports with prompt logprobs (None: none
        asked, or all of them reported)."""
        if len(self.prompt_logprobs) >= self.num_prompt_tokens:
            return None
        return self.request.prompt_logprobs

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def remaining(self) -> int:
        """Tokens still allowed by max_new_tokens."""
        # without copying output_ids
        return self.request.max_new_tokens - (len(self.token_ids) - self.num_prompt_tokens)

    @property
    def max_tokens(self) -> int:
        """The most tokens the sequence can hold: prompt + max_new_tokens."""
        return self.num_prompt_tokens + self.request.max_new_tokens

    @property
    def reserve_tokens(self) -> int:
        """What the caches reserve for it now: the engine's grant (it grows as the sequence does),
        else the most it can hold."""
        return self.max_tokens if self.granted_tokens is None else self.granted_tokens

    @property
    def queue_s(self) -> float:
        """Seconds it waited for a cache slot before its first round (so far, if still waiting)."""
        return (self.started_at if self.started_at is not None else time.monotonic()) - self.queued_at

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
