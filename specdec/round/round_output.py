"""What the engine hands out: each round's confirmed tokens per request, and a finished
request's result."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.requests.stats import SpecStats
from specdec.sampling.token_logprobs import TokenLogprob

FINISH_ERROR = "error"  # finish_reason of a request that failed alone


@dataclass
class RoundOutput:
    """What one round confirmed for one sequence (what a stream sends to the client).

    text: the new text (stable, cut before a stop string; "" without a tokenizer).
    error: set when this request failed (finish_reason "error"); the others go on.
    logprobs: one per new token when the request asked for them (specdec.sampling.token_logprobs), else None.
    """

    seq_id: str
    new_token_ids: list[int]
    finish_reason: str | None
    text: str = ""
    error: BaseException | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on a row's first output, when asked for


@dataclass
class GenerationResult:
    seq_id: str
    token_ids: list[int]  # generated tokens only
    text: str
    finish_reason: str
    stats: SpecStats
    queue_s: float = 0.0  # seconds it waited for a cache slot before its first round
    logprobs: list[TokenLogprob] | None = None  # one per generated token, when the request asked for them
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (None first), when asked for
