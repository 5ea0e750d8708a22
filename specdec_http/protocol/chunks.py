"""The server-sent chunks of a stream (`stream: true`): one per round with tokens; the last
carries finish_reason and `speculation`, then (with `stream_options.include_usage`) a chunk
with the usage and no choices (with `continuous_usage_stats` too, every chunk carries the
usage so far). Dumped with `exclude_unset`, as the responses are."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specdec_http.protocol.logprobs import ChatLogprobs, CompletionLogprobs
from specdec_http.protocol.responses import Envelope, SpeculationStats, Usage
from specdec_http.protocol.tools import ToolCallDelta


class CompletionChunkChoice(BaseModel):
    """A text completion's new text this round."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = Field(description="with the request's logprobs, else null")
    finish_reason: str | None


class ChatDelta(BaseModel):
    """A chat completion's new content this round (the first chunk names the role); with
    tools, the tool calls' deltas (content is then left out when there is none)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    """A chat completion's delta this round."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = Field(description="with the request's logprobs, else null")
    finish_reason: str | None


class CompletionChunk(Envelope):
    """A chunk of a /v1/completions stream (object: text_completion)."""

    choices: list[CompletionChunkChoice]
    speculation: SpeculationStats | None = Field(None, description="on the last chunk with choices")
    usage: Usage | None = Field(
        None, description="on the usage chunk (choices empty); with continuous_usage_stats on every chunk, so far")


class ChatCompletionChunk(Envelope):
    """A chunk of a /v1/chat/completions stream (object: chat.completion.chunk)."""

    choices: list[ChatChunkChoice]
    speculation: SpeculationStats | None = Field(None, description="on the last chunk with choices")
    usage: Usage | None = Field(
        None, description="on the usage chunk (choices empty); with continuous_usage_stats on every chunk, so far")
