"""The core frontend's results as OpenAI's JSON: completion objects, streamed chunks, errors,
each built as its typed model (`specdec_http.protocol`).

A Completion becomes a `text_completion` or `chat.completion` object; Deltas become
their streamed chunks (server-sent events, ending with `data: [DONE]`); a chat request with
tools gets its output read for tool calls (`specdec_http.tool_calls`). The round
statistics ride along as the extension object `speculation`. Errors are OpenAI's
`{"error": {"message", "type", "param", "code"}}` with an HTTP status from the core's
error kind: 400 bad input (param names the field), 404, 429 (admission limit),
503 (not ready / a worker down), 504 (the request's deadline), 500.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from specdec.serving.frontend import Completion, Delta, Usage
from specdec.serving.serving_errors import ErrorKind, param_of
from specdec.requests.stats import SpecStats
from specdec.sampling.token_logprobs import TokenLogprob
from specdec.serving.tool_parser import ToolParser
from specdec_http import tool_calls
from specdec_http.openai_logprobs import LogprobsFormat
from specdec_http.protocol.chunks import (
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, CompletionChunk, CompletionChunkChoice,
)
from specdec_http.protocol.errors import ErrorDetail, ErrorResponse
from specdec_http.protocol.responses import (
    AssistantMessage, ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, PromptTokensDetails,
    SpeculationStats,
)
from specdec_http.protocol.responses import Usage as UsageModel

ERRORS = {  # kind -> (HTTP status, OpenAI error type, code)
    ErrorKind.INVALID: (400, "invalid_request_error", None),
    ErrorKind.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key"),
    ErrorKind.NOT_FOUND: (404, "invalid_request_error", "not_found"),
    ErrorKind.OVERLOADED: (429, "rate_limit_error", "admission_limit"),
    ErrorKind.UNAVAILABLE: (503, "service_unavailable_error", "unavailable"),
    ErrorKind.DEADLINE: (504, "timeout_error", "deadline_exceeded"),
    ErrorKind.INTERNAL: (500, "internal_error", None),
}
DONE = "data: [DONE]\n\n"
#: the core's field names that OpenAI calls otherwise
OPENAI_PARAMS = {"max_new_tokens": "max_tokens", "prompt_token_ids": "prompt"}


@dataclass(frozen=True)
class Call:
    """Who is answering what: the response id, the object kind ("text_completion" or
    "chat.completion"), the model name and when it was created (Unix seconds)."""

    id: str
    kind: str
    model: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> "Call":
        prefix, kind = ("chatcmpl", "chat.completion") if chat else ("cmpl", "text_completion")
        return cls(f"{prefix}-{uuid.uuid4().hex}", kind, model, int(time.time()))

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion"

    def envelope(self, chunk: bool = False) -> dict[str, Any]:
        kind = "chat.completion.chunk" if chunk and self.chat else self.kind
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def speculation_stats(stats: SpecStats) -> SpeculationStats:
    """The request's round statistics (the `speculation` extension object of a response)."""
    return SpeculationStats(
        rounds=stats.rounds, drafted=stats.drafted, accepted=stats.accepted,
        acceptance_rate=stats.acceptance_rate, mean_accepted_length=stats.mean_accepted_length,
        gamma=stats.gamma, speculation_enabled=stats.gamma > 0 and not stats.speculation_unavailable,
    )


def usage(counts: Usage) -> UsageModel:
    return UsageModel(prompt_tokens=counts.prompt_tokens, completion_tokens=counts.completion_tokens,
                      total_tokens=counts.total_tokens,
                      prompt_tokens_details=PromptTokensDetails(cached_tokens=counts.cached_tokens))


def completion_object(call: Call, completions: Completion | list[Completion],
                      logprobs: LogprobsFormat | list[LogprobsFormat | None] | None = None,
                      echo: list[str] | None = None, n: int = 1,
                      tools: list[ToolParser | None] | None = None) -> dict[str, Any]:
    """The whole response of a unary request: one choice per completion, in index order
    (`logprobs`: how to report each one's, when asked for; `echo`: the prompt text each
    choice's text starts with; n: choices per prompt, whose prompt is counted once; `tools`:
    each choice's tool-call parser, for a chat request that offers tools)."""
    completions = completions if isinstance(completions, list) else [completions]
    formats = logprobs if isinstance(logprobs, list) else [logprobs] * len(completions)
    stats = SpecStats()
    for completion in completions:
        stats.merge(completion.stats)
    prompts = completions[::n]  # n choices share a prompt: counted once
    counts = Usage(sum(c.usage.prompt_tokens for c in prompts), sum(c.usage.completion_tokens for c in completions),
                   sum(c.usage.cached_tokens for c in prompts))
    done = {"usage": usage(counts), "speculation": speculation_stats(stats)}
    parsers = tools or [None] * len(completions)
    choices = [_choice(call, i, c, formats[i], echo[i] if echo else None, parsers[i])
               for i, c in enumerate(completions)]
    kind = ChatCompletionResponse if call.chat else CompletionResponse
    return dump(kind(**call.envelope(), choices=choices, **done))


def _choice(call: Call, index: int, completion: Completion, how: LogprobsFormat | None, echo: str | None,
            tools: ToolParser | None):
    """One choice of a unary response."""
    if call.chat:
        message = AssistantMessage(role="assistant", content=completion.text) if tools is None else \
            tool_calls.message(tools.parse(completion.text))
        return ChatChoice(index=index, message=message, logprobs=_logprobs(call, completion.logprobs, how),
                          finish_reason=tool_calls.finish_reason(completion.finish_reason, tools))
    reported = _echoed(completion, how, echo)
    return CompletionChoice(index=index, text=(echo or "") + completion.text, logprobs=reported,
                            finish_reason=completion.finish_reason)


def _echoed(part: Completion | Delta, how: LogprobsFormat | None, echo: str | None) -> Any:
    """A completion choice's logprobs; with echo and prompt logprobs, the prompt's first."""
    if how is None:
        return None
    if echo is None or part.prompt_logprobs is None:
        return how.completion(part.logprobs or [])
    prompt = how.prompt(part.prompt_token_ids, part.prompt_logprobs)  # first: the offsets run on from it
    how.offset = len(echo)  # the completion's text starts after the echoed prompt
    return how.joined(prompt, how.completion(part.logprobs or []))


@dataclass(frozen=True)
class UsageReport:
    """Where a stream reports its usage (`stream_options`): `final` (include_usage) in a
    chunk without choices after the last one; `continuous` (vLLM's continuous_usage_stats,
    with include_usage) also on every chunk, the counts so far."""

    final: bool = False
    continuous: bool = False

    @classmethod
    def of(cls, stream_options: dict[str, Any] | None) -> "UsageReport":
        final = bool((stream_options or {}).get("include_usage"))
        return cls(final, final and bool(stream_options.get("continuous_usage_stats")))


def chunk_events(call: Call, delta: Delta, first: bool, report: UsageReport,
                 logprobs: LogprobsFormat | None = None, index: int = 0, echo: str | None = None,
                 tools: ToolParser | None = None) -> list[str]:
    """The server-sent events for one Delta of choice `index`: one chunk per round (a chat
    stream's first chunk also carries the role; with `echo`, a completion's first chunk
    starts with the prompt and its logprobs); the last one adds finish_reason and
    `speculation`, then a usage chunk without choices (`report`: which usage goes out). With
    `logprobs`, each chunk carries its tokens' logprobs; with `tools` (the choice's tool
    parser), its content and tool-call deltas as the parser reads them."""
    kind = ChatCompletionChunk if call.chat else CompletionChunk
    if call.chat:
        reported = _logprobs(call, delta.logprobs, logprobs)
        if tools is None:
            content = ChatDelta(role="assistant", content=delta.text) if first else ChatDelta(content=delta.text)
        else:
            content = tool_calls.delta(tools.feed(delta.text, final=delta.finish_reason is not None), first)
        choice = ChatChunkChoice(index=index, delta=content, logprobs=reported,
                                 finish_reason=tool_calls.finish_reason(delta.finish_reason, tools))
    else:
        echo = echo if first else None
        choice = CompletionChunkChoice(index=index, text=(echo or "") + delta.text,
                                       logprobs=_echoed(delta, logprobs, echo), finish_reason=delta.finish_reason)
    extra = {} if delta.stats is None else {"speculation": speculation_stats(delta.stats)}
    if report.continuous and delta.usage is not None:
        extra["usage"] = usage(delta.usage)
    events = [sse(dump(kind(**call.envelope(chunk=True), choices=[choice], **extra)))]
    if report.final and delta.finish_reason is not None and delta.usage is not None:
        events.append(usage_event(call, delta.usage))
    return events


def usage_event(call: Call, counts: Usage) -> str:
    """The usage chunk that ends a stream with stream_options.include_usage (no choices)."""
    kind = ChatCompletionChunk if call.chat else CompletionChunk
    return sse(dump(kind(**call.envelope(chunk=True), choices=[], usage=usage(counts))))


def _logprobs(call: Call, tokens: list[TokenLogprob] | None, how: LogprobsFormat | None) -> Any:
    """The choice's logprobs object: None unless the request asked for them."""
    if how is None:
        return None
    return how.chat(tokens or []) if call.chat else how.completion(tokens or [])


def dump(response: BaseModel) -> dict[str, Any]:
    """A response model as JSON data: the fields the server set (even to null), no others."""
    return response.model_dump(mode="json", exclude_unset=True)


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_body(kind: ErrorKind, message: str, exc: BaseException | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, OpenAI's error object) for a failure of `kind` (an exception with an
    `openai_code`, e.g. model_not_found, sets the code)."""
    status, kind_name, code = ERRORS[kind]
    code = getattr(exc, "openai_code", None) or code
    param = param_of(exc) if exc is not None and kind is ErrorKind.INVALID else None
    if param in OPENAI_PARAMS:  # name the field as the client sent it
        message = OPENAI_PARAMS[param] + message[len(param):] if message.startswith(param) else message
        param = OPENAI_PARAMS[param]
    return status, dump(ErrorResponse(error=ErrorDetail(message=message, type=kind_name, param=param, code=code)))
