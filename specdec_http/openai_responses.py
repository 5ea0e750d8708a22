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
    AssistantMessage, ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, SpeculationStats,
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
                      total_tokens=counts.total_tokens)


def completion_object(call: Call, completion: Completion, logprobs: LogprobsFormat | None = None,
                      tools: ToolParser | None = None) -> dict[str, Any]:
    """The whole response of a unary request (`logprobs`: how to report them, when asked for;
    `tools`: the parser of a chat request's tool calls, when it offers tools)."""
    done = {"usage": usage(completion.usage), "speculation": speculation_stats(completion.stats)}
    reported = _logprobs(call, completion.logprobs, logprobs)
    if call.chat:
        message = AssistantMessage(role="assistant", content=completion.text) if tools is None else \
            tool_calls.message(tools.parse(completion.text))
        choice = ChatChoice(index=0, message=message, logprobs=reported,
                            finish_reason=tool_calls.finish_reason(completion.finish_reason, tools))
        return dump(ChatCompletionResponse(**call.envelope(), choices=[choice], **done))
    choice = CompletionChoice(index=0, text=completion.text, logprobs=reported, finish_reason=completion.finish_reason)
    return dump(CompletionResponse(**call.envelope(), choices=[choice], **done))


def chunk_events(call: Call, delta: Delta, first: bool, include_usage: bool,
                 logprobs: LogprobsFormat | None = None, tools: ToolParser | None = None) -> list[str]:
    """The server-sent events for one Delta: one chunk per round (a chat stream's first
    chunk also carries the role); the last one adds finish_reason and `speculation`, then
    (with stream_options.include_usage) a usage chunk without choices. With `logprobs`, each
    chunk carries its tokens' logprobs; with `tools` (the stream's tool parser), its content
    and tool-call deltas as the parser reads them."""
    kind = ChatCompletionChunk if call.chat else CompletionChunk
    reported = _logprobs(call, delta.logprobs, logprobs)
    if call.chat:
        if tools is None:
            content = ChatDelta(role="assistant", content=delta.text) if first else ChatDelta(content=delta.text)
        else:
            content = tool_calls.delta(tools.feed(delta.text, final=delta.finish_reason is not None), first)
        choice = ChatChunkChoice(index=0, delta=content, logprobs=reported,
                                 finish_reason=tool_calls.finish_reason(delta.finish_reason, tools))
    else:
        choice = CompletionChunkChoice(index=0, text=delta.text, logprobs=reported, finish_reason=delta.finish_reason)
    extra = {} if delta.stats is None else {"speculation": speculation_stats(delta.stats)}
    events = [sse(dump(kind(**call.envelope(chunk=True), choices=[choice], **extra)))]
    if include_usage and delta.usage is not None:
        events.append(sse(dump(kind(**call.envelope(chunk=True), choices=[], usage=usage(delta.usage)))))
    return events


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
