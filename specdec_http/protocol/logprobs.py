"""The `logprobs` of a choice: each generated token's logprob and its most likely
alternatives, from the target's processed distribution (`specdec.sampling.token_logprobs`).

Completions (`logprobs: k`) use the legacy shape (parallel lists); chat (`logprobs: true`,
`top_logprobs: k`) a list of token objects. A token's text is its id decoded alone; a token
the request's top-k / top-p removed has logprob -9999.0 (JSON has no -inf; vLLM's value).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class CompletionLogprobs(BaseModel):
    """Completions' logprobs: one entry per generated token in each list."""

    tokens: list[str] = Field(description="each token's text")
    token_logprobs: list[float | None] = Field(description="each token's logprob")
    top_logprobs: list[dict[str, float] | None] = Field(
        description="per token, its k most likely alternatives (text -> logprob)")
    text_offset: list[int] = Field(description="where each token's text starts in the choice's text")


class TopLogprob(BaseModel):
    """An alternative at a chat token's position."""

    token: str
    logprob: float
    bytes: list[int] | None = Field(description="the token text's UTF-8 bytes")


class ChatTokenLogprob(TopLogprob):
    """A generated chat token, with its alternatives."""

    top_logprobs: list[TopLogprob] = Field(description="the top_logprobs most likely tokens at this position")


class ChatLogprobs(BaseModel):
    """Chat's logprobs: one entry per generated token of the content."""

    content: list[ChatTokenLogprob] | None
