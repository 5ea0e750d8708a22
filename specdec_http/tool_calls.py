"""Tool calls in a chat response: the model's output read by its tool parser (the core's
`specdec.serving.tool_parser`) into OpenAI's `message.tool_calls`, or a stream's
`delta.tool_calls`, with `finish_reason: "tool_calls"` when the output called a tool and
ended on its own (one cut by the budget keeps "length").

A request reads its output for calls only when it offers tools and its tool_choice is not
"none"; otherwise its content is the output text, as without tools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdec.serving.text_request import TextRequest
from specdec.serving.tool_format import parser_for
from specdec.serving.tool_parser import ParsedDelta, ParsedOutput, ToolParser
from specdec_http.protocol.chunks import ChatDelta
from specdec_http.protocol.responses import AssistantMessage
from specdec_http.protocol.tools import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta

FINISH_TOOL_CALLS = "tool_calls"


def tool_parser(request: TextRequest, tokenizer: Callable[[], Any]) -> ToolParser | None:
    """A fresh parser of the request's output (the format of the served model, whose tokenizer
    `tokenizer()` gives: asked only when the request offers tools); None without tools."""
    if request.tools is None or not request.tools.calls_allowed:
        return None
    return parser_for(tokenizer())()


def finish_reason(reason: str | None, parser: ToolParser | None) -> str | None:
    """The choice's finish_reason: tool_calls once the output called a tool and stopped."""
    return FINISH_TOOL_CALLS if reason == "stop" and parser is not None and parser.called else reason


def message(parsed: ParsedOutput) -> AssistantMessage:
    """The reply of a unary response: its content and (when it made any) its calls."""
    if not parsed.calls:
        return AssistantMessage(role="assistant", content=parsed.content)
    calls = [ToolCall(id=c.id, type="function", function=FunctionCall(name=c.name, arguments=c.arguments))
             for c in parsed.calls]
    return AssistantMessage(role="assistant", content=parsed.content, tool_calls=calls)


def delta(parsed: ParsedDelta, first: bool) -> ChatDelta:
    """A chunk's delta: its content (left out when the piece only added calls) and call deltas."""
    fields: dict[str, Any] = {"role": "assistant"} if first else {}
    if parsed.content or not parsed.calls:
        fields["content"] = parsed.content
    if parsed.calls:
        fields["tool_calls"] = [_call_delta(d) for d in parsed.calls]
    return ChatDelta(**fields)


def _call_delta(d) -> ToolCallDelta:
    if d.id is None:
        return ToolCallDelta(index=d.index, function=FunctionCallDelta(arguments=d.arguments))
    return ToolCallDelta(index=d.index, id=d.id, type="function",
                         function=FunctionCallDelta(name=d.name, arguments=d.arguments))
