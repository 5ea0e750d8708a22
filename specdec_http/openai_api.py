"""OpenAI's request JSON (completions, chat completions) to the core frontend's requests.

A request body becomes a `TextRequest`; every bad or unsupported field raises
InvalidRequestError naming it (400). Defaults follow OpenAI where it has one
(temperature 1.0, top_p 1.0, n 1) and the server otherwise (max_tokens unset = the
server's `generation.max_new_tokens`). Extensions: `top_k`, `stop_token_ids` (as vLLM),
`speculation` {mode, gamma, proposer} and `timeout_s` (the request's deadline, 504 past it).
The responses are `specdec_http.openai_responses`'.

A body nested deeper than `MAX_DEPTH` is refused naming its top-level field: no valid
request nests that deep, and a deeply nested value is costly (or, past Python's
recursion limit, impossible) to compare or echo in an error message.
"""

from __future__ import annotations

import math
from typing import Any

from specdec.chat_template import check_messages
from specdec.sampling_params import SamplingParams
from specdec.serving_errors import InvalidRequestError, param_of
from specdec.text_request import TextRequest

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "n", "stream",
          "stream_options", "speculation", "timeout_s", "user"}
#: accepted at their neutral value only (anything else is refused, naming the field)
NEUTRAL = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
           "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
           "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"), "response_format": (None,),
           "max_completion_tokens": (None,)}
#: the deepest nesting a body may have (a chat message's content parts: 5 levels)
MAX_DEPTH = 8


def completion_request(body: Any, model: str) -> tuple[TextRequest, bool]:
    """(the frontend's request, stream?) for a /v1/completions body."""
    _check_fields(body, COMMON | {"prompt"}, model)
    prompt, ids = _prompt(body.get("prompt"))
    return _text_request(body, prompt=prompt, prompt_token_ids=ids), _stream(body)


def chat_request(body: Any, model: str) -> tuple[TextRequest, bool]:
    """(the frontend's request, stream?) for a /v1/chat/completions body."""
    _check_fields(body, COMMON | {"messages", "max_completion_tokens"}, model)
    messages = check_messages(body.get("messages"))
    if body.get("max_completion_tokens") is not None:  # the newer name of max_tokens
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    return _text_request(body, messages=messages), _stream(body)


def _check_fields(body: Any, allowed: set[str], model: str) -> None:
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    for name, value in body.items():
        if _depth(value) > MAX_DEPTH - 1:  # first: the checks below compare and echo values
            raise InvalidRequestError(name, f"is nested deeper than {MAX_DEPTH} levels")
        if name in allowed:
            continue
        if name in NEUTRAL:
            if value not in NEUTRAL[name]:
                raise InvalidRequestError(name, f"is not supported by this server (got {value!r})")
            continue
        raise InvalidRequestError(name, "unrecognized request argument")
    if body.get("model") not in (None, model):
        raise InvalidRequestError("model", f"the model {body.get('model')!r} does not exist here (serving {model!r})")
    if body.get("n") is not None and (isinstance(body["n"], bool) or body["n"] != 1):  # true == 1 in Python
        raise InvalidRequestError("n", f"only n = 1 is supported (one choice per request), got {body.get('n')!r}")


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


def _prompt(prompt: Any) -> tuple[str, tuple[int, ...]]:
    """(text, token ids) for OpenAI's prompt: a string, a list of one string, or token ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, ()
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return "", tuple(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise InvalidRequestError("prompt", "one prompt per request (a list of several is a batch; send them apart)")
    raise InvalidRequestError("prompt", "must be a non-empty string or a list of token ids")


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream not in (None, True, False):
        raise InvalidRequestError("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise InvalidRequestError("stream_options", "must be an object with include_usage (true or false)")
    return bool(stream)


def _text_request(body: dict[str, Any], **prompt: Any) -> TextRequest:
    mode, gamma, proposer = _speculation(body.get("speculation"))
    return TextRequest(
        **prompt,
        max_new_tokens=_optional_int(body, "max_tokens", minimum=1),
        sampling=_sampling(body),
        stop=_stop(body.get("stop")),
        stop_token_ids=tuple(_int_list(body, "stop_token_ids")),
        mode=mode, gamma=gamma, proposer=proposer,
        timeout_s=_optional_number(body, "timeout_s"),
    )


def _sampling(body: dict[str, Any]) -> SamplingParams:
    temperature = _optional_number(body, "temperature")
    top_p = _optional_number(body, "top_p")
    try:
        return SamplingParams(
            temperature=1.0 if temperature is None else temperature,
            top_k=_optional_int(body, "top_k", minimum=0) or 0,
            top_p=1.0 if top_p is None else top_p,
            seed=_optional_int(body, "seed", minimum=0),
        )
    except ValueError as exc:  # SamplingParams names the field first
        raise InvalidRequestError(param_of(exc) or "body", str(exc).split(" ", 1)[1]) from None


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidRequestError("stop", "must be a string or a list of strings")


def _speculation(value: Any) -> tuple[str, int | None, str | None]:
    """(mode, γ, proposer) of the `speculation` extension object."""
    if value is None:
        return "auto", None, None
    if not isinstance(value, dict) or set(value) - {"mode", "gamma", "proposer"}:
        raise InvalidRequestError("speculation", "must be an object with mode, gamma and/or proposer")
    mode = value.get("mode") or "auto"
    gamma = _optional_int(value, "gamma", minimum=0, prefix="speculation.")
    proposer = value.get("proposer")
    if proposer is not None and not isinstance(proposer, str):
        raise InvalidRequestError("speculation.proposer", "must be a proposer name")
    return mode, gamma, proposer


def _optional_int(body: dict[str, Any], name: str, minimum: int, prefix: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidRequestError(prefix + name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _optional_number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidRequestError(name, f"must be a finite number, got {value!r}")
    return float(value)


def _int_list(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise InvalidRequestError(name, "must be a list of token ids")
    return value
