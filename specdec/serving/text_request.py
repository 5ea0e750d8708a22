"""A request as a client states it, in no protocol's terms, and how it becomes the engine's.

`TextRequest` holds a text prompt, token ids or chat messages (and the tools they offer),
the budget (None = the server's), sampling, stop conditions and the speculation settings;
`to_generation_request` renders chat messages with the tokenizer's template, tokenises (run
it off the event loop) and builds the engine's request (with the grammar that forces tool
calls, when the tool_choice asks for them), whose own rules (`specdec.requests.request`) check every field; the
proposer is checked against those the server has. Checks that need the model (ids in range,
prompt + budget within the context, the caps) run when the engine admits the request
(`GenerationRequest.check_limits`).

A text prompt longer than `ServerDefaults.max_prompt_chars` is refused from its length
alone: it could not fit the context, and tokenising it would cost every other request.
Text that is not valid Unicode (a lone UTF-16 surrogate, which a JSON string's \\u escapes can
carry) is refused naming its field: no tokenizer can encode it, and no output can match it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.serving.chat_template import render_chat
from specdec.requests.grammar_spec import GrammarSpec
from specdec.requests.request import GenerationRequest
from specdec.sampling.grammar_xgrammar import parsed_grammar as check_grammar
from specdec.sampling.sampling_params import SamplingParams
from specdec.requests.speculation_mode import SpeculationMode
from specdec.serving.served_engine import ServerDefaults
from specdec.serving.serving_errors import InvalidRequestError
from specdec.serving.tool_grammar import tool_grammar
from specdec.serving.tool_parser_hermes import END
from specdec.serving.tool_spec import ToolUse


@dataclass(frozen=True)
class TextRequest:
    """What a client asks for (exactly one of prompt, prompt_token_ids, messages).

    max_new_tokens: the budget (None = the server's default).
    mode / gamma / proposer: the speculation mode; γ (None = the server's);
        a proposer name a request may pick (None = the server's).
    tpot_target_ms: time-per-output-token target, milliseconds (None = the server's).
    timeout_s: the request's own deadline (None = none): past it, DeadlineExceededError.
    request_id: the server's unique id for the request (the engine's sequence id, so logs
        and responses name it alike); None = one the engine makes up.
    ignore_eos: generate past the model's end-of-sequence tokens (load tools ask for it
        so every request runs its whole budget).
    logprobs: None, or report each generated token's logprob with this many alternatives.
    grammar: the output must match it (structured output), or None.
    prompt_logprobs: None, or report each prompt token's logprob with this many alternatives.
    A request with prompt_logprobs may ask for max_new_tokens 0: it only scores its prompt
    (the engine runs it for one token, which the frontend drops).
    tools: the tools a chat request offers and its tool_choice (rendered into the prompt;
        "required" and a named tool force calls with a grammar: `specdec.serving.tool_grammar`).
    """

    prompt: str = ""
    prompt_token_ids: tuple[int, ...] = ()
    messages: tuple[dict[str, str], ...] = ()
    max_new_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    mode: SpeculationMode | str = SpeculationMode.AUTO
    gamma: int | None = None
    proposer: str | None = None
    timeout_s: float | None = None
    request_id: str | None = None
    ignore_eos: bool = False
    tpot_target_ms: float | None = None
    logprobs: int | None = None
    grammar: GrammarSpec | None = None
    tools: ToolUse | None = None
    prompt_logprobs: int | None = None

    @property
    def scores_only(self) -> bool:
        """It asks for its prompt's logprobs and no output (max_new_tokens 0)."""
        return self.max_new_tokens == 0 and self.prompt_logprobs is not None


def to_generation_request(
    request: TextRequest, encode: Callable[[str], list[int]], defaults: ServerDefaults, tokenizer: Any = None,
    model: str = "this model",
) -> GenerationRequest:
    """The engine's request; ValueError naming the field when bad. (Runs the tokenizer and
    the chat template: call it off the event loop.)"""
    _check_text(request)
    prompt_ids = _prompt_ids(request, encode, defaults.max_prompt_chars, tokenizer, model)
    if request.timeout_s is not None and not request.timeout_s > 0:
        raise InvalidRequestError("timeout_s", f"must be > 0 seconds, got {request.timeout_s}")
    forced = tool_grammar(request.tools)  # tool_choice required / named
    if forced is not None and request.grammar is not None:
        raise InvalidRequestError("response_format", "cannot be combined with tool_choice required or a named tool")
    core = GenerationRequest(
        prompt_token_ids=prompt_ids,
        max_new_tokens=_budget(request, defaults),
        sampling=request.sampling,
        stop=tuple(request.stop),
        server_stop=_call_end(request.tools, forced),
        stop_token_ids=tuple(request.stop_token_ids),
        gamma=request.gamma,
        proposer=request.proposer,
        mode=request.mode,
        ignore_eos=request.ignore_eos,
        tpot_target_ms=request.tpot_target_ms,
        logprobs=request.logprobs,
        grammar=forced or request.grammar,
        prompt_logprobs=request.prompt_logprobs,
    )
    if request.grammar is not None:
        check_grammar(request.grammar)  # a grammar that does not parse fails here, naming grammar.text
    core.check_proposer(defaults.proposers)
    return core


def _call_end(tools: ToolUse | None, forced: GrammarSpec | None) -> tuple[str, ...]:
    """The stop string that ends an unforced output at its first call's end, when the request
    allows one call only (a forced output's grammar already ends it there)."""
    return (END,) if forced is None and tools is not None and tools.single_call else ()


def _budget(request: TextRequest, defaults: ServerDefaults) -> int:
    """The engine's max_new_tokens: the server's when unset; 1 for a request that only scores its prompt."""
    if request.max_new_tokens is None:
        return defaults.max_new_tokens
    return 1 if request.scores_only else request.max_new_tokens


def _check_text(request: TextRequest) -> None:
    """Every string of the request encodes as UTF-8 (InvalidRequestError naming it otherwise)."""
    texts = [("prompt", request.prompt)] + [(f"stop[{i}]", s) for i, s in enumerate(request.stop)]
    for i, message in enumerate(request.messages):
        texts += _strings(message, f"messages[{i}]")
    for name, text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(
                name, f"is not valid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start}"
            ) from None


def _strings(value: Any, where: str) -> list[tuple[str, str]]:
    """(where, text) of every string inside a message (its tool calls' too)."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _strings(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [s for i, item in enumerate(value) for s in _strings(item, f"{where}[{i}]")]
    return []


def _prompt_ids(request: TextRequest, encode: Callable[[str], list[int]], max_chars: int, tokenizer: Any,
                model: str) -> list[int]:
    given = [bool(request.prompt), bool(request.prompt_token_ids), bool(request.messages)]
    if sum(given) > 1:
        raise InvalidRequestError("prompt", "set exactly one of prompt and prompt_token_ids, not both")
    if request.prompt_token_ids:
        return list(request.prompt_token_ids)
    text = request.prompt
    if request.messages:
        if sum(len(text) for m in request.messages for _, text in _strings(m, "")) > max_chars:
            raise InvalidRequestError("messages", f"more than {max_chars} characters cannot fit the context")
        text = render_chat(tokenizer, request.messages, model, request.tools)
    elif not text:
        raise InvalidRequestError("prompt", "must not be empty (set prompt or prompt_token_ids)")
    if len(text) > max_chars:
        raise InvalidRequestError(
            "prompt",
            f"{len(text)} characters cannot fit the context (at most {max_chars} characters are even tokenised)",
        )
    ids = encode(text)
    if not ids:
        raise InvalidRequestError("prompt", "encodes to no tokens")
    return ids
