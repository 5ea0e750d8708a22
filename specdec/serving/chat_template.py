"""Chat messages to a prompt, with the tokenizer's own chat template (transformers' Jinja),
the offered tools and past tool calls in the model's tool format (`tool_format`).

A model without a chat template cannot be chatted with: that is the request's problem,
reported as bad input naming `messages` (the caller can use the completions API instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdec.serving.serving_errors import InvalidRequestError
from specdec.serving.tool_format import hermes_messages, template_knows_tools, template_messages
from specdec.serving.tool_messages import tool_call_message
from specdec.serving.tool_spec import ToolUse

ROLES = ("system", "user", "assistant", "developer", "tool")


def check_messages(messages: Any, max_messages: int = 1024) -> tuple[dict[str, Any], ...]:
    """Messages as {role, content} dicts with text content; InvalidRequestError naming the
    offending message otherwise. Content may be a string or a list of {"type": "text"} parts
    (joined with newlines, as vLLM does). An assistant message may carry `tool_calls` (its
    content may then be null) and a tool message its `tool_call_id`; both are kept
    (`tool_call_message`)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of {role, content} objects")
    if len(messages) > max_messages:
        raise InvalidRequestError("messages", f"{len(messages)} messages exceed the limit {max_messages}")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages))


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise InvalidRequestError(where, "must be an object with role and content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise InvalidRequestError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequestError(f"{where}.content", "only text parts ({type: text, text}) are supported")
        content = "\n".join(p["text"] for p in content)  # as vLLM joins text parts
    calls = message.get("tool_calls") if role == "assistant" else None
    if content is None and calls:
        content = ""  # an assistant message that only calls tools
    if not isinstance(content, str):
        raise InvalidRequestError(f"{where}.content", "must be a string")
    return tool_call_message({"role": role, "content": content}, message, where)


def render_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], model: str = "this model",
                tools: ToolUse | None = None) -> str:
    """The prompt text for `messages`, ending where the assistant's reply begins; with
    `tools` whose choice is not "none", the tools are offered in the model's tool format
    (`specdec.serving.tool_format`)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError(
            "messages", f"{model} has no chat template (its tokenizer_config.json sets none); use /v1/completions"
        )
    offered = tools.tools if tools is not None and tools.calls_allowed else ()
    if template_knows_tools(tokenizer):
        extra = {"tools": [t.as_openai() for t in offered]} if offered else {}
        return tokenizer.apply_chat_template(template_messages(messages), tokenize=False, add_generation_prompt=True,
                                             **extra)
    uses_tools = offered or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    rendered = hermes_messages(messages, offered) if uses_tools else list(messages)
    return tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
