"""A model's tool format: how offered tools and past tool calls go into its prompt, and which
parser reads the calls out of its output.

A chat template that knows tools (its Jinja source uses `tools`, as Qwen's, Hermes' and
Llama 3.1's do) renders them itself: `apply_chat_template(tools=...)`, with each past call's
arguments as a mapping, as transformers' templates expect. A template that does not (the
bundled pair's) gets the Hermes/Qwen format written into the messages it renders: a system
block listing the tools' JSON schemas and asking for
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, the assistant's past calls as
such blocks in its content, and tool results wrapped in `<tool_response>` tags. That is the
bundled pair's tool format (docs/tool_calling.md). Both read back with the Hermes parser
(`specdec.serving.tool_parser_hermes`), the format the forced-call grammar writes too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specdec.serving.tool_parser import ToolParser
from specdec.serving.tool_parser_hermes import HermesToolParser, call_block
from specdec.serving.tool_spec import Tool

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def template_knows_tools(tokenizer: Any) -> bool:
    """The tokenizer's chat template renders `tools` itself."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: transformers picks "tool_use" when tools are given
        return "tool_use" in template or any("tools" in str(t) for t in template.values())
    return isinstance(template, str) and "tools" in template


def parser_for(tokenizer: Any) -> type[ToolParser]:
    """The parser of the model's tool calls: Hermes/Qwen `<tool_call>` JSON (the only format
    read so far; a template with another format still gets its calls returned as content)."""
    return HermesToolParser


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a tool-aware template takes them: each call's arguments as a mapping."""
    return [_with_argument_mappings(m) if m.get("tool_calls") else dict(m) for m in messages]


def hermes_messages(messages: Sequence[dict[str, Any]], tools: Sequence[Tool]) -> list[dict[str, str]]:
    """The messages in the Hermes/Qwen format, as plain {role, content} messages for a
    template that knows no tools: the tool list in (or as) the first system message, past
    calls as `<tool_call>` blocks, tool results in `<tool_response>` tags."""
    rendered = [_hermes_message(m) for m in messages]
    if tools:
        block = TOOLS_HEADER + "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools) + TOOLS_FOOTER
        if rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": f"{rendered[0]['content']}\n\n{block}"}
        else:
            rendered.insert(0, {"role": "system", "content": block})
    return rendered


def _hermes_message(message: dict[str, Any]) -> dict[str, str]:
    content = message.get("content") or ""
    if message["role"] == "tool":
        return {"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = [call_block(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", ())]
    return {"role": message["role"], "content": "\n".join([content.strip()] * bool(content.strip()) + calls)}


def _with_argument_mappings(message: dict[str, Any]) -> dict[str, Any]:
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}
