"""The tool parts of a conversation's messages: an assistant message's past `tool_calls`
and a tool message's `tool_call_id` (the call it answers), checked and kept as OpenAI
writes them, so that the chat template can render them (`specdec.serving.tool_format`).

A past call is {"id", "type": "function", "function": {"name", "arguments"}} with the
arguments as JSON text of an object (what a client got back from this server, or OpenAI).
"""

from __future__ import annotations

import json
from typing import Any

from specdec.requests.errors import InvalidRequestError


def tool_call_message(checked: dict[str, Any], message: dict[str, Any], where: str) -> dict[str, Any]:
    """`checked` ({role, content}) with the tool parts of `message` that its role may carry."""
    calls = message.get("tool_calls")
    if calls is not None and checked["role"] == "assistant":
        if not isinstance(calls, list):
            raise InvalidRequestError(f"{where}.tool_calls", "must be a list of tool calls")
        checked["tool_calls"] = [_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    call_id = message.get("tool_call_id")
    if checked["role"] == "tool" and call_id is not None:
        if not isinstance(call_id, str):
            raise InvalidRequestError(f"{where}.tool_call_id", f"must be a string, got {call_id!r:.80}")
        checked["tool_call_id"] = call_id
    return checked


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise InvalidRequestError(where, "must be {id, type: function, function: {name, arguments}}")
    name, arguments = function.get("name"), function.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}.function.name", "must be a non-empty string")
    try:
        decoded = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise InvalidRequestError(f"{where}.function.arguments",
                                  f"must be JSON text of an object, got {arguments!r:.80}")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}.id", f"must be a string, got {call_id!r:.80}")
    return {"id": call_id or "", "type": "function", "function": {"name": name, "arguments": arguments}}
