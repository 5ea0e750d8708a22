"""OpenAI's request JSON (completions, chat completions) to the core frontend's requests: the
one place that maps the protocol's models (`specdec_http.protocol`) to a `TextRequest`.

A body is validated into its typed model (`protocol.requests`); every bad or unsupported
field raises InvalidRequestError naming it (400): the validation error's location in the
body becomes the param (`speculation.gamma`, `messages[0].content`). What the values mean to
the engine is checked once, by the core (`specdec.serving.text_request`, `SamplingParams`). A
negative seed (OpenAI's seeds are int64) maps to the core's uint64 seeds as its two's
complement (seed mod 2**64): deterministic, and no two int64 seeds share one. An unknown
model is 404 `model_not_found`. A chat request's `tools` and `tool_choice` become the core's
`ToolUse` (`specdec.serving.tool_spec`, which checks them). The responses are
`specdec_http.openai_responses`'.

A body nested deeper than `MAX_DEPTH` is refused naming its top-level field before it is
validated: no valid request nests that deep, and a deeply nested value is costly (or, past
Python's recursion limit, impossible) to compare or echo in an error message.
"""

from __future__ import annotations

import logging
import re
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from specdec.serving.chat_template import check_messages
from specdec.sampling.sampling_params import SamplingParams
from specdec.serving.fan_out import MAX_CHOICES, choice_requests
from specdec.serving.serving_errors import InvalidRequestError, NotFoundError, param_of
from specdec.serving.text_request import TextRequest
from specdec_http.openai_structured import grammar_of
from specdec.serving.tool_spec import Tool, ToolUse
from specdec_http.protocol.requests import ChatCompletionRequest, CompletionRequest, SamplingRequest
from specdec_http.protocol.tools import NamedToolChoice

logger = logging.getLogger(__name__)
_logged_ignored: set[str] = set()

#: the deepest nesting a body may have (a chat message's content parts: 5 levels)
MAX_DEPTH = 8
#: a logit_bias key: a token id in ASCII digits (not "²", not a 5000-digit number)
_TOKEN_ID = re.compile(r"\s*-?[0-9]{1,19}\s*")


class ModelNotFoundError(NotFoundError):
    """The request named a model this server does not serve (404 `model_not_found`, as OpenAI)."""

    openai_code = "model_not_found"


@dataclass(frozen=True)
class Choices:
    """What one generation request asks for: one frontend request per choice, in OpenAI's
    index order (prompt i // n, sample i % n; `specdec.serving.fan_out`), n per prompt,
    whether it streams and whether each choice's text starts with its prompt (echo)."""

    requests: list[TextRequest]
    n: int
    stream: bool
    echo: bool = False


def completion_request(body: Any, model: str) -> tuple[TextRequest, bool]:
    """(the frontend's request of the first choice, stream?) for a /v1/completions body."""
    choices = completion_choices(body, model)
    return choices.requests[0], choices.stream


def chat_request(body: Any, model: str) -> tuple[TextRequest, bool]:
    """(the frontend's request of the first choice, stream?) for a /v1/chat/completions body."""
    choices = chat_choices(body, model)
    return choices.requests[0], choices.stream


def completion_choices(body: Any, model: str) -> Choices:
    """The choices of a /v1/completions body: n per prompt of its prompt or list of prompts.
    echo with logprobs asks for the prompt's logprobs too; echo with max_tokens 0 scores
    the prompt alone."""
    request = parse(CompletionRequest, body, model)
    logprobs = None if request.logprobs is False else request.logprobs
    echo = bool(request.echo)
    if request.max_tokens == 0 and not echo:
        raise InvalidRequestError("max_tokens", "must be >= 1 (0 only with echo: the prompt's logprobs alone)")
    scoring = logprobs if logprobs is not None else 0 if request.max_tokens == 0 else None
    prompts = [_text_request(request, logprobs, prompt=text, prompt_token_ids=ids,
                             prompt_logprobs=scoring if echo else None) for text, ids in _prompts(request.prompt)]
    return _choices(request, prompts, echo)


def chat_choices(body: Any, model: str) -> Choices:
    """The n choices of a /v1/chat/completions body."""
    request = parse(ChatCompletionRequest, body, model)
    messages = check_messages([m.model_dump(exclude_unset=True) for m in request.messages])
    if request.max_completion_tokens is not None:  # the newer name of max_tokens
        request = request.model_copy(update={"max_tokens": request.max_completion_tokens})
    if request.top_logprobs and not request.logprobs:
        raise InvalidRequestError("top_logprobs", "needs logprobs: true")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    prompt = _text_request(request, logprobs, messages=messages, tools=_tool_use(request))
    return _choices(request, [prompt], echo=False)


def _choices(request: SamplingRequest, prompts: list[TextRequest], echo: bool) -> Choices:
    """n choices per prompt; 400 naming n or best_of when they ask for what is not served."""
    n = request.n or 1
    if request.best_of is not None and request.best_of != n:
        raise InvalidRequestError("best_of", f"must equal n ({n}) (choices are not reranked), got {request.best_of}")
    if len(prompts) * n > MAX_CHOICES:
        raise InvalidRequestError("n", f"{len(prompts)} prompts × n = {n} exceed {MAX_CHOICES} choices per request")
    return Choices(choice_requests(prompts, n), n, bool(request.stream), echo)


def _tool_use(request: ChatCompletionRequest) -> ToolUse | None:
    """The core's view of `tools` and `tool_choice` (None: no tools; "none" without tools is
    the neutral value clients send by default)."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none"):
            raise InvalidRequestError("tool_choice", "is only allowed when tools are given")
        return None
    tools = tuple(Tool.of(t.function.name, t.function.description, t.function.parameters, f"tools[{i}]")
                  for i, t in enumerate(request.tools))
    parallel = request.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        return ToolUse(tools, "named", choice.function.name, parallel)
    return ToolUse(tools, choice or "auto", parallel=parallel)


def parse(kind: type[SamplingRequest], body: Any, model: str) -> Any:
    """`body` as a `kind` model; InvalidRequestError naming the first bad field, 404 for
    another model. Ignored fields are logged (once per field)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    for name, value in body.items():
        if _depth(value) > MAX_DEPTH - 1:  # first: validation compares and echoes values
            raise InvalidRequestError(name, f"is nested deeper than {MAX_DEPTH} levels")
    try:
        request = kind.model_validate(body)
    except ValidationError as exc:
        raise _invalid(kind, exc) from None
    check_model(request.model, model)
    if request.stream_options is not None and not request.stream:
        raise InvalidRequestError("stream_options", "is only allowed when stream is true")
    for name in kind.IGNORED:
        if name in body and name not in _logged_ignored:
            _logged_ignored.add(name)
            logger.info("requests send %r, which changes nothing here: ignored", name)
    return request


def named_as_sent(exc: ValueError, body: Any, chat: bool) -> ValueError:
    """A chat request's bad-input error from the core, naming the field as the client sent
    it: the core's budget (max_new_tokens) is `max_completion_tokens` when the body set that,
    the core's prompt is `messages`. Any other error as it is."""
    param = param_of(exc)
    sent = {"max_new_tokens": "max_completion_tokens", "prompt": "messages",
            "prompt_token_ids": "messages"}.get(param or "")
    if not chat or not isinstance(body, dict) or sent not in body:
        return exc
    return InvalidRequestError(sent, str(exc).removeprefix(param).lstrip(": ") or "is invalid")


def check_model(requested: Any, model: str) -> None:
    """ModelNotFoundError unless `requested` is the served model (or left out)."""
    if requested not in (None, model):
        raise ModelNotFoundError(f"The model {requested!r} does not exist (this server serves {model!r})")


def _invalid(kind: type[BaseModel], exc: ValidationError) -> InvalidRequestError:
    """The first error of a validation, naming the field it is about."""
    error = exc.errors()[0]
    param = field_path(kind, error["loc"])
    if error["type"] == "extra_forbidden":
        if len(error["loc"]) == 1:
            return InvalidRequestError(error["loc"][0], "unrecognized request argument")
        return InvalidRequestError(param, f"has no field {error['loc'][-1]!r}")
    message = error["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:]
    if error["type"] not in ("value_error", "missing") and "input" in error:
        message += f", got {error['input']!r:.100}"
    return InvalidRequestError(param, message)


def field_path(kind: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The path of a validation error's location through the protocol's models
    ("speculation.gamma", "messages[0].content"), down to the last model field it names (the
    members of a union or a list of scalars are no fields of their own)."""
    path, model, i = "", kind, 0
    while i < len(loc) and model is not None:
        field = model.model_fields.get(loc[i]) if isinstance(loc[i], str) else None
        if field is None:
            break
        path = f"{path}.{loc[i]}" if path else loc[i]
        model, item = _nested_model(field.annotation)
        i += 1
        if item is not None and i < len(loc) and isinstance(loc[i], int):
            path, model, i = f"{path}[{loc[i]}]", item, i + 1
    return path


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, type[BaseModel] | None]:
    """(the model a field holds, the model a list field holds), either None."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) is not list else ()
    for member in members or (annotation,):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member, None
        if typing.get_origin(member) is list:
            (item,) = typing.get_args(member)
            if isinstance(item, type) and issubclass(item, BaseModel):
                return None, item
    return None, None


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (0 for a scalar); iterative, so that no
    depth can exhaust the stack, and it stops counting past MAX_DEPTH."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_DEPTH:
            return deepest
        todo.extend((child, depth + 1) for child in children)
    return deepest


def _prompts(prompt: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(text, token ids) per prompt of OpenAI's prompt: a string, token ids, or a non-empty list of either."""
    if isinstance(prompt, str):
        return [(prompt, ())]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [("", tuple(prompt))]
    if isinstance(prompt, list) and prompt and all(prompt):
        return [(p, ()) if isinstance(p, str) else ("", tuple(p)) for p in prompt]
    raise InvalidRequestError("prompt", "must be a non-empty string, token ids, or a non-empty list of them")


def _text_request(request: SamplingRequest, logprobs: int | None, prompt_logprobs: int | None = None,
                  **prompt: Any) -> TextRequest:
    speculation = request.speculation
    stop = request.stop
    return TextRequest(
        **prompt,
        max_new_tokens=request.max_tokens,
        sampling=_sampling(request),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        mode=(speculation and speculation.mode) or "auto",
        gamma=speculation and speculation.gamma,
        proposer=speculation and speculation.proposer,
        tpot_target_ms=speculation and speculation.tpot_target_ms,
        timeout_s=request.timeout_s,
        ignore_eos=bool(request.ignore_eos),
        logprobs=logprobs,
        grammar=grammar_of(request),
        prompt_logprobs=prompt_logprobs,
    )


def _processing(request: SamplingRequest) -> dict[str, Any]:
    """min_p, the penalties and logit_bias as SamplingParams arguments (left out: the core's
    neutral default; logit_bias keys are token ids written as strings, as OpenAI's)."""
    names = ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
    fields = {name: getattr(request, name) for name in names if getattr(request, name) is not None}
    bias = request.logit_bias or {}
    if not all(_TOKEN_ID.fullmatch(k) for k in bias):
        raise InvalidRequestError("logit_bias", "must map token ids (as strings of ASCII digits) to numbers")
    fields["logit_bias"] = {int(k): v for k, v in bias.items()}
    return fields


def _sampling(request: SamplingRequest) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_k=max(request.top_k or 0, 0),  # -1 = none (as vLLM)
            top_p=1.0 if request.top_p is None else request.top_p,
            seed=None if request.seed is None else request.seed % 2**64,  # int64 -> uint64 (two's complement)
            **_processing(request),
        )
    except ValueError as exc:  # SamplingParams names the field first
        raise InvalidRequestError(param_of(exc) or "body", str(exc).split(" ", 1)[1]) from None
