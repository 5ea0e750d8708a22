"""The request bodies of /v1/completions and /v1/chat/completions.

Defaults follow OpenAI where it has one (temperature 1.0, top_p 1.0, n 1) and the server
otherwise (max_tokens left out = the server's `generation.max_new_tokens`). Extensions:
`top_k` (-1 or 0 = none), `stop_token_ids` and `ignore_eos` (as vLLM), `min_p`, the
penalties and `logit_bias` (exact under speculation: docs/logits_processing.md), `structured_outputs`
(`protocol.response_format`; with `response_format`: docs/structured_output.md), `speculation`
{mode, gamma, proposer, tpot_target_ms} and `timeout_s` (the request's deadline, 504 past it).
Fields this server does not implement are accepted at the neutral value load tools send by
default and refused otherwise (`fields.neutral_only`); fields that change nothing returned
are accepted and ignored (`fields.ignored`); any other field is refused (a misspelt
`max_token` must not pass silently).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specdec.sampling.token_logprobs import MAX_TOP_LOGPROBS
from specdec.serving.fan_out import MAX_CHOICES
from specdec_http.protocol.chat_messages import ChatMessage
from specdec_http.protocol.response_format import ResponseFormat, StructuredOutputs
from specdec_http.protocol.fields import MAX_SEED, MIN_SEED, Bool, Float, Int, TokenIds, ignored, neutral_only
from specdec_http.protocol.tools import ChatTool, ToolChoice

NUMBER, INTEGER, BOOLEAN, OBJECT = {"type": "number"}, {"type": "integer"}, {"type": "boolean"}, {"type": "object"}


class StreamOptions(BaseModel):
    """Options of a stream (only with `stream: true`)."""

    model_config = ConfigDict(extra="forbid")

    include_usage: Bool | None = Field(None, description="end the stream with a chunk carrying the usage")
    continuous_usage_stats: Bool | None = Field(
        None, description="extension (as vLLM; with include_usage): every chunk also carries the usage so far")

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        """One error naming `stream_options` for any bad shape."""
        names = ("include_usage", "continuous_usage_stats")
        if not isinstance(value, dict) or set(value) - set(names) or \
                any(value.get(name) not in (None, True, False) for name in names):
            raise ValueError("must be an object with include_usage and continuous_usage_stats (true or false)")
        return value


class Speculation(BaseModel):
    """The `speculation` extension: how this request may speculate (the core checks the values)."""

    model_config = ConfigDict(extra="forbid")

    mode: str | None = Field(None, description="auto (the server's policy), on or off; left out = auto")
    gamma: Annotated[Int, Field(ge=0)] | None = Field(None, description="drafted tokens per round (γ)")
    proposer: str | None = Field(None, description="a proposer this server offers (GET /v1/models)")
    tpot_target_ms: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="the request's time-per-output-token target in ms (> 0; left out = the server's)")


class SamplingRequest(BaseModel):
    """The fields both generation routes share."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="the served model (left out = it); another one is 404")
    max_tokens: Annotated[Int, Field(ge=0)] | None = Field(
        None, description="the budget (0 only with echo: the prompt's logprobs alone); left out = the server's")
    temperature: Float | None = Field(None, description="0 = greedy; left out = 1.0")
    top_p: Float | None = Field(None, description="nucleus sampling, in (0, 1]; left out = 1.0")
    top_k: Annotated[Int, Field(ge=-1)] | None = Field(None, description="extension: -1 or 0 = no limit")
    seed: Annotated[Int, Field(ge=MIN_SEED, le=MAX_SEED)] | None = Field(
        None, description="int64 (a negative seed is its two's complement) or uint64; same seed, same output")
    stop: str | list[str] | None = Field(None, description="stop strings (not part of the output)")
    stop_token_ids: TokenIds | None = Field(None, description="extension (as vLLM): token ids that end the output")
    stream: Bool | None = Field(None, description="answer with server-sent events, one chunk per round")
    stream_options: StreamOptions | None = None
    speculation: Speculation | None = None
    timeout_s: Float | None = Field(None, description="extension: the request's deadline in seconds (504 past it)")
    user: Annotated[str, Field(strict=True)] | None = Field(None, description="the end user's id (logged)")
    ignore_eos: Bool | None = Field(None, description="extension (as vLLM): generate past end-of-sequence tokens")
    n: Annotated[Int, Field(ge=1, le=MAX_CHOICES)] | None = Field(
        None, description=f"choices to sample from each prompt (1..{MAX_CHOICES}, prompts × n too); left out = 1")
    best_of: Annotated[Int, Field(ge=1)] | None = Field(None, description="accepted when equal to n (no reranking)")
    echo: neutral_only(BOOLEAN, False, why="is only supported on /v1/completions") = None
    presence_penalty: Float | None = Field(
        None, description="in [-2, 2]: subtracted once from each generated token's logit")
    frequency_penalty: Float | None = Field(
        None, description="in [-2, 2]: subtracted from a token's logit per time it was generated")
    repetition_penalty: Float | None = Field(
        None, description="> 0 (as transformers): divides positive logits of tokens seen in prompt or output")
    min_p: Float | None = Field(None, description="in [0, 1]: drop tokens below min_p × the top token's probability")
    logit_bias: dict[str, Float] | None = Field(
        None, description="token id (as a string) -> bias in [-100, 100] added to its logit")
    suffix: neutral_only({"type": "string"}, "") = None
    tools: neutral_only({"type": "array"}, []) = None
    tool_choice: neutral_only({"type": ["string", "object"]}, "none") = None
    response_format: ResponseFormat | None = Field(
        None, description="text (default), json_object or json_schema: the output follows it "
                          "(docs/structured_output.md)")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="extension (as vLLM): exactly one of json (a schema), regex, grammar (EBNF)")
    metadata: ignored(OBJECT) = None
    store: ignored(BOOLEAN) = None
    service_tier: ignored({"type": "string"}) = None
    prompt_cache_key: ignored({"type": "string"}) = None
    safety_identifier: ignored({"type": "string"}) = None

    #: the fields accepted and ignored (logged once each)
    IGNORED: ClassVar[tuple[str, ...]] = ("metadata", "store", "service_tier", "prompt_cache_key",
                                          "safety_identifier")


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | TokenIds | list[str] | list[TokenIds] | None = Field(
        None, description=f"a string, token ids, or a list of either (one choice per prompt × n; "
                          f"at most {MAX_CHOICES} choices)")
    echo: Bool | None = Field(
        None, description="prepend the prompt to each choice's text (with logprobs: its tokens' logprobs first, "
                          "the first null)")
    max_completion_tokens: neutral_only(INTEGER) = None  # chat's name of max_tokens
    top_logprobs: neutral_only(INTEGER, 0) = None  # chat's; completions' logprobs says how many
    logprobs: Annotated[Int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | Literal[False] | None = Field(
        None, description="each generated token's logprob and this many most likely alternatives (false = none)")


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(description="the conversation, rendered by the tokenizer's chat template")
    tools: list[ChatTool] | None = Field(
        None, description="functions the model may call, rendered in the model's tool format (docs/tool_calling.md)")
    tool_choice: ToolChoice | None = Field(
        None, description="none, auto (the default with tools), required (one or more calls) or "
                          "{type: function, function: {name}} (that call); required and named force it with a grammar")
    parallel_tool_calls: Bool | None = Field(
        None, description="false: at most one call per answer (true, the default: one or more)")
    max_completion_tokens: Annotated[Int, Field(ge=1)] | None = Field(None, description="the newer name of max_tokens")
    logprobs: Bool | None = Field(None, description="report each generated token's logprob")
    top_logprobs: Annotated[Int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="with logprobs: this many most likely alternatives per token")
