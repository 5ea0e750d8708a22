"""The grammar that forces tool calls: `tool_choice` "required" (one or more calls; exactly one
with `parallel_tool_calls: false`) or a named tool (exactly one call of it), as a `GrammarSpec`
the grammar engine enforces on the output.

The output must be Hermes `<tool_call>` blocks (`specdec.serving.tool_parser_hermes`), one
per line, each holding `{"name": <an allowed tool>, "arguments": <an object its JSON schema
accepts>}` written compactly (", " and ": " separators, as `call_block` writes past calls).
The call object's grammar comes from xgrammar's JSON-schema converter (the engine's EBNF
dialect); its root rule is renamed so that ours, the sequence of blocks, is the root.
Nothing else may be written, so the matcher ends the output after the last block.
"""

from __future__ import annotations

import json
import re

from specdec.requests.errors import InvalidRequestError
from specdec.requests.grammar_spec import GrammarSpec
from specdec.serving.tool_parser_hermes import END, START
from specdec.serving.tool_spec import ToolUse

#: the rule the call object's grammar gets instead of its `root`
CALL_RULE = "tool_call_object"
# a string literal, a character class, or the identifier `root` (only the last is renamed)
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\b(root)\b')


def call_schema(tools: ToolUse) -> dict:
    """The JSON schema of one call object: a callable tool's name and its arguments."""
    calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools.callable]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def tool_grammar(tools: ToolUse | None) -> GrammarSpec | None:
    """The forcing grammar of a request whose tool_choice is required or named; None otherwise."""
    if tools is None or not tools.forced:
        return None
    block = f'"{_literal(START + chr(10))}" {CALL_RULE} "{_literal(chr(10) + END)}"'
    repeat = "" if tools.single_call else f' ("\\n" {block})*'
    return GrammarSpec("ebnf", f"root ::= {block}{repeat}\n{_call_rules(tools)}")


def _call_rules(tools: ToolUse) -> str:
    """The call object's grammar rules, its root renamed CALL_RULE."""
    try:
        import xgrammar
    except ImportError:
        raise InvalidRequestError("tool_choice", f"{tools.choice!r} needs the grammar engine (the xgrammar "
                                                 "package), which this server does not have") from None
    try:
        grammar = xgrammar.Grammar.from_json_schema(json.dumps(call_schema(tools)), any_whitespace=False,
                                                    separators=(", ", ": "))
    except Exception as exc:  # noqa: BLE001 - whatever the converter refuses is the client's schema
        raise InvalidRequestError("tools", f"a tool's parameters cannot be turned into a grammar: {exc}") from None
    return _TOKENS.sub(lambda m: CALL_RULE if m.group(1) else m.group(0), str(grammar))


def _literal(text: str) -> str:
    """`text` inside an EBNF string literal."""
    return json.dumps(text)[1:-1]
