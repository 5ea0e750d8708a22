"""OpenAI's request JSON (completions, chat completions) to the core frontend's requests.

A request body becomes a `TextRequest`; every bad or unsupported field raises
InvalidRequestError naming it (400). Defaults follow OpenAI where it has one
(temperature 1.0, top_p 1.0, n 1) and the server otherwise (max_tokens unset = the
server's `generation.max_new_tokens`). Extensions: `top_k` (-1 or 0 = none), `stop_token_ids`
and `ignore_eos` (as vLLM), `speculation` {mode, gamma, proposer, tpot_target_ms} and `timeout_s` (the
request's deadline, 504 past it). Fields this server does not implement are accepted at
the neutral value load tools send by default (`repetition_penalty: 1.0`, `best_of: 1`,
`response_format: {"type": "text"}`, ...) and refused otherwise, since ignoring them would
change the output the client expects. A negative seed (OpenAI's seeds are int64) maps to
the core's uint64 seeds as its two's complement (seed mod 2**64): deterministic, and no two
int64 seeds share one. OpenAI fields that change nothing returned (`metadata`, `store`, ...)
are ignored; an unknown field is refused (a misspelt `max_token` must not pass silently).
An unknown model is 404 `model_not_found`.
The responses are `specdec_http.openai_responses`'.

A body nested deeper than `MAX_DEPTH` is refused naming its top-level field: no valid
request nests that deep, and a deeply nested value is costly (or, past Python's
recursion limit, impossible) to compare or echo in an error message.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from specdec.chat_template import check_messages
from specdec.request import check_speculation
from specdec.sampling_params import SamplingParams
from specdec.serving_errors import InvalidRequestError, NotFoundError, param_of
from specdec.text_request import TextRequest

logger = logging.getLogger(__name__)
_logged_ignored: set[str] = set()

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "n", "stream",
          "stream_options", "speculation", "timeout_s", "user", "ignore_eos",
          "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"}
#: accepted at their neutral value only (anything else is refused, naming the field); `logprobs: 0` is
#: not neutral on completions (OpenAI then returns the sampled tokens' logprobs)
NEUTRAL = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
           "suffix": (None, ""), "tools": (None, []),
           "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}), "max_completion_tokens": (None,)}
#: OpenAI fields that change nothing this server returns: accepted and ignored (logged once per field)
IGNORED = {"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "parallel_tool_calls"}
#: the deepest nesting a body may have (a chat message's content parts: 5 levels)
MAX_DEPTH = 8
MIN_SEED = -(2**63)  # OpenAI's seeds are int64; negative ones map to their two's complement in uint64
MAX_SEED = 2**64 - 1  # the core's seeds are uint64


class ModelNotFoundError(NotFoundError):
    """The request named a model this server does not serve (404 `model_not_found`, as OpenAI)."""

    openai_code = "model_not_found"


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
        if name in IGNORED:
            if name not in _logged_ignored:
                _logged_ignored.add(name)
                logger.info("requests send %r, which changes nothing here: ignored", name)
            continue
        if name in NEUTRAL:
            if not _is_neutral(value, NEUTRAL[name]):
                raise InvalidRequestError(name, f"is not supported by this server (got {value!r})")
            continue
        raise InvalidRequestError(name, "unrecognized request argument")
    check_model(body.get("model"), model)
    if not isinstance(body.get("user", ""), (str, type(None))):
        raise InvalidRequestError("user", f"must be a string (the end user's id, logged), got {body['user']!r}")
    if not _is_neutral(body.get("n"), (None, 1)):
        raise InvalidRequestError("n", f"only n = 1 is supported (one choice per request), got {body.get('n')!r}")


def check_model(requested: Any, model: str) -> None:
    """ModelNotFoundError unless `requested` is the served model (or left out)."""
    if requested not in (None, model):
        raise ModelNotFoundError(f"The model {requested!r} does not exist (this server serves {model!r})")


def _is_neutral(value: Any, neutrals: tuple[Any, ...]) -> bool:
    """Equal to one of `neutrals`, a bool only to a bool (`best_of: true` is not 1)."""
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutrals)


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
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"} or \
                options.get("include_usage") not in (None, True, False):
            raise InvalidRequestError("stream_options", "must be an object with include_usage (true or false)")
        if not stream:
            raise InvalidRequestError("stream_options", "is only allowed when stream is true")
    return bool(stream)


def _text_request(body: dict[str, Any], **prompt: Any) -> TextRequest:
    mode, gamma, proposer, tpot_target_ms = _speculation(body.get("speculation"))
    return TextRequest(
        **prompt,
        max_new_tokens=_optional_int(body, "max_tokens", minimum=1),
        sampling=_sampling(body),
        stop=_stop(body.get("stop")),
        stop_token_ids=tuple(_int_list(body, "stop_token_ids")),
        mode=mode, gamma=gamma, proposer=proposer, tpot_target_ms=tpot_target_ms,
        timeout_s=_optional_number(body, "timeout_s"),
        ignore_eos=_optional_bool(body, "ignore_eos"),
    )


def _sampling(body: dict[str, Any]) -> SamplingParams:
    temperature = _optional_number(body, "temperature")
    top_p = _optional_number(body, "top_p")
    try:
        return SamplingParams(
            temperature=1.0 if temperature is None else temperature,
            top_k=max(_optional_int(body, "top_k", minimum=-1) or 0, 0),  # -1 = none (as vLLM)
            top_p=1.0 if top_p is None else top_p,
            seed=_seed(body),
            **_processing(body),
        )
    except ValueError as exc:  # SamplingParams names the field first
        raise InvalidRequestError(param_of(exc) or "body", str(exc).split(" ", 1)[1]) from None


def _processing(body: dict[str, Any]) -> dict[str, Any]:
    """min_p, the penalties and logit_bias as SamplingParams arguments (JSON null = the
    neutral value; logit_bias keys are token ids written as strings, as OpenAI's)."""
    neutral = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    values = {name: _optional_number(body, name) for name in neutral}
    fields = {name: default if values[name] is None else values[name] for name, default in neutral.items()}
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict) or not all(isinstance(k, str) and k.strip().lstrip("-").isdigit() for k in bias):
        raise InvalidRequestError("logit_bias", "must map token ids (as strings) to numbers")
    fields["logit_bias"] = {int(k): v for k, v in bias.items()}
    return fields


def _seed(body: dict[str, Any]) -> int | None:
    """The core's uint64 seed: a negative int64 seed is its two's complement (seed mod 2**64)."""
    seed = _optional_int(body, "seed", minimum=MIN_SEED)
    if seed is not None and seed > MAX_SEED:
        raise InvalidRequestError("seed", f"must be an integer in [-2**63, 2**64), got {seed!r}")
    return None if seed is None else seed % 2**64


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidRequestError("stop", "must be a string or a list of strings")


def _speculation(value: Any) -> tuple[str, int | None, str | None, float | None]:
    """(mode, γ, proposer, TPOT target in ms) of the `speculation` extension object."""
    if value is None:
        return "auto", None, None, None
    if not isinstance(value, dict) or set(value) - {"mode", "gamma", "proposer", "tpot_target_ms"}:
        raise InvalidRequestError("speculation", "must be an object with mode, gamma, proposer and/or tpot_target_ms")
    mode, gamma, proposer = value.get("mode") or "auto", value.get("gamma"), value.get("proposer")
    if isinstance(gamma, float) and gamma.is_integer():
        gamma = int(gamma)
    target = value.get("tpot_target_ms")
    return check_speculation(mode, gamma, proposer, target), gamma, proposer, target


def _optional_int(body: dict[str, Any], name: str, minimum: int, prefix: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidRequestError(prefix + name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _optional_number(body: dict[str, Any], name: str, prefix: str = "") -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidRequestError(prefix + name, f"must be a finite number, got {value!r}")
    return float(value)


def _optional_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequestError(name, f"must be true or false, got {value!r}")
    return bool(value)


def _int_list(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise InvalidRequestError(name, "must be a list of token ids")
    return value
