"""Chat messages to a prompt, with the tokenizer's own chat template (transformers' Jinja).

A model without a chat template cannot be chatted with: that is the request's problem,
reported as bad input naming `messages` (the caller can use the completions API instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdec.serving.serving_errors import InvalidRequestError

ROLES = ("system", "user", "assistant", "developer", "tool")


def check_messages(messages: Any, max_messages: int = 1024) -> tuple[dict[str, str], ...]:
    """Messages as {role, content} dicts with text content; InvalidRequestError naming the
    offending message otherwise. Content may be a string or a list of {"type": "text"} parts
    (joined with newlines, as vLLM does)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of {role, content} objects")
    if len(messages) > max_messages:
        raise InvalidRequestError("messages", f"{len(messages)} messages exceed the limit {max_messages}")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages))


def _message(message: Any, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise InvalidRequestError(where, "must be an object with role and content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise InvalidRequestError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequestError(f"{where}.content", "only text parts ({type: text, text}) are supported")
        content = "\n".join(p["text"] for p in content)  # as vLLM joins text parts
    if not isinstance(content, str):
        raise InvalidRequestError(f"{where}.content", "must be a string")
    return {"role": role, "content": content}


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]], model: str = "this model") -> str:
    """The prompt text for `messages`, ending where the assistant's reply begins."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError(
            "messages", f"{model} has no chat template (its tokenizer_config.json sets none); use /v1/completions"
        )
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
