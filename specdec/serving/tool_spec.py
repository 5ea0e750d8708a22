"""The tools a chat request offers and how the model may use them (OpenAI's `tools` and
`tool_choice`), checked once at entry.

A `Tool` is a function: a name (OpenAI's pattern: letters, digits, `_` and `-`, at most 64),
a description and the JSON schema of its arguments (an object schema; checked as a JSON
schema when the `jsonschema` package is there). `ToolUse` holds the offered tools and the
choice: "none" (the model answers in text: the tools are not rendered and its output is not
parsed for calls), "auto" (it may call tools: the output is parsed for calls), "required"
(it must call one or more) or a named tool (it must call that one). The last two are
enforced by a grammar over the output (`specdec.serving.tool_grammar`). `parallel` false
(OpenAI's `parallel_tool_calls: false`) allows at most one call: the grammar takes one block,
and an unforced output ends where its first call does.
Every refusal is an InvalidRequestError naming the field as the client sent it
(`tools[1].function.name`, `tool_choice`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from specdec.requests.errors import InvalidRequestError

#: how the model may use the tools (a named tool is the fourth choice)
TOOL_CHOICES = ("none", "auto", "required")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    """One function the model may call. parameters_json: its arguments' JSON schema, as JSON
    text (the dataclass stays immutable and hashable)."""

    name: str
    description: str = ""
    parameters_json: str = json.dumps(EMPTY_PARAMETERS)

    @classmethod
    def of(cls, name: str, description: str | None, parameters: Any, where: str) -> "Tool":
        """A checked tool; `where` names it in errors (`tools[0]`)."""
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidRequestError(f"{where}.function.name",
                                      f"must be 1 to 64 letters, digits, '_' or '-', got {name!r:.80}")
        parameters = EMPTY_PARAMETERS if parameters is None else parameters
        _check_schema(parameters, f"{where}.function.parameters")
        return cls(name, description or "", json.dumps(parameters, ensure_ascii=False))

    @property
    def parameters(self) -> dict[str, Any]:
        return json.loads(self.parameters_json)

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI writes it (what chat templates take as `tools`)."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolUse:
    """The tools offered and the choice: "none", "auto", "required" or "named" (`name`: the
    tool the model must call). parallel: the output may make several calls (OpenAI's
    `parallel_tool_calls`; false: at most one)."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    name: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        if not self.tools:
            raise InvalidRequestError("tools", "must list at least one tool")
        seen: set[str] = set()
        for i, tool in enumerate(self.tools):
            if tool.name in seen:
                raise InvalidRequestError(f"tools[{i}].function.name", f"{tool.name!r} is offered twice")
            seen.add(tool.name)
        if self.choice == "named":
            if self.name not in seen:
                raise InvalidRequestError("tool_choice.function.name",
                                          f"{self.name!r:.80} is not one of the tools ({', '.join(sorted(seen))})")
        elif self.choice not in TOOL_CHOICES:
            raise InvalidRequestError("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a named function, "
                                                     f"got {self.choice!r:.80}")

    @property
    def calls_allowed(self) -> bool:
        """The tools are rendered into the prompt and the output is read for calls."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """The output must be tool calls (a grammar enforces it)."""
        return self.choice in ("required", "named")

    @property
    def single_call(self) -> bool:
        """The output may make at most one call (the first call's end ends the output)."""
        return self.calls_allowed and (self.choice == "named" or not self.parallel)

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools the output may call: the named one, or all of them."""
        return tuple(t for t in self.tools if t.name == self.name) if self.choice == "named" else self.tools


def _check_schema(parameters: Any, where: str) -> None:
    """An object schema (a JSON schema, when the jsonschema package is there to check it)."""
    if not isinstance(parameters, dict):
        raise InvalidRequestError(where, "must be a JSON schema object")
    if parameters.get("type", "object") != "object":
        raise InvalidRequestError(where, f"must describe an object (type: object), got type {parameters['type']!r:.40}")
    try:
        import jsonschema
    except ImportError:  # the shape check above is all there is
        return
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as exc:
        raise InvalidRequestError(where, f"is not a valid JSON schema: {exc.message:.200}") from None
