"""The unary responses of /v1/completions and /v1/chat/completions, and their parts shared
with streamed chunks (`usage`, the `speculation` extension).

Responses are dumped with `exclude_unset`: a field the server set (even to null, as
`logprobs` is) is sent, one it left out is not.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specdec_http.protocol.logprobs import ChatLogprobs, CompletionLogprobs
from specdec_http.protocol.tools import ToolCall


class PromptTokensDetails(BaseModel):
    """What became of the prompt's tokens."""

    cached_tokens: int = Field(description="prompt tokens the target's prefix cache held (whole cache blocks), "
                                           "not computed again")


class Usage(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class SpeculationStats(BaseModel):
    """Extension: the request's round statistics."""

    rounds: int = Field(description="rounds the request ran")
    drafted: int = Field(description="drafted tokens")
    accepted: int = Field(description="accepted drafted tokens")
    acceptance_rate: float = Field(description="accepted / drafted (0 when nothing was drafted)")
    mean_accepted_length: float = Field(description="tokens emitted per round")
    gamma: int = Field(description="the γ of its last round")
    speculation_enabled: bool = Field(description="it drafted (γ > 0 and the proposer could)")


class CompletionChoice(BaseModel):
    """The one choice of a text completion."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = Field(description="with the request's logprobs, else null")
    finish_reason: str | None = Field(description="stop, length or error")


class AssistantMessage(BaseModel):
    """The reply of a chat completion."""

    role: Literal["assistant"]
    content: str | None = Field(description="the text (null when the reply only calls tools)")
    tool_calls: list[ToolCall] | None = Field(None, description="the tools it calls (with tools; only when it does)")


class ChatChoice(BaseModel):
    """The one choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = Field(description="with the request's logprobs, else null")
    finish_reason: str | None = Field(description="stop, length, tool_calls or error")


class Envelope(BaseModel):
    """What every response and chunk starts with."""

    id: str = Field(description="cmpl-... or chatcmpl-...: the request's id in the server's logs")
    object: str
    created: int = Field(description="Unix seconds")
    model: str


class CompletionResponse(Envelope):
    """The response of a unary /v1/completions request (object: text_completion)."""

    choices: list[CompletionChoice]
    usage: Usage
    speculation: SpeculationStats


class ChatCompletionResponse(Envelope):
    """The response of a unary /v1/chat/completions request (object: chat.completion)."""

    choices: list[ChatChoice]
    usage: Usage
    speculation: SpeculationStats
