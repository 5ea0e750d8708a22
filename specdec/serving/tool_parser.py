"""Reading tool calls out of a model's output text: the parser interface and what it returns.

A `ToolParser` is fed the output as it is generated (`feed`, once per round; `final=True`
with the last piece) and returns, per piece, the `ParsedDelta`: the text that is content and
the `ToolCallDelta`s (a call's first delta carries its index, id and function name, later
ones more of its arguments' JSON text). `parse` reads a whole output at once, with the same
rules, so a stream's deltas add up to the unary answer (`ParsedOutput`). Ids are OpenAI's
shape, `call_` and 24 hex digits. One parser per request: it holds the request's state.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """A whole call: its id, the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """More of call `index` (0, 1, ... in output order): the first delta names id and name,
    every delta adds `arguments` text (possibly "")."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass
class ParsedDelta:
    """What one piece of output adds: content text and tool-call deltas."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def add_call(self, delta: ToolCallDelta) -> None:
        """Append, merging with the last delta when it is of the same call."""
        last = self.calls[-1] if self.calls else None
        if last is not None and last.index == delta.index and delta.id is None:
            self.calls[-1] = ToolCallDelta(last.index, last.arguments + delta.arguments, last.id, last.name)
        else:
            self.calls.append(delta)


@dataclass(frozen=True)
class ParsedOutput:
    """A whole output: its content (None when it only called tools) and its calls."""

    content: str | None
    calls: tuple[ToolCall, ...]


class ToolParser(ABC):
    """Reads one request's output for tool calls (see the module's docstring)."""

    @abstractmethod
    def feed(self, text: str, final: bool = False) -> ParsedDelta:
        """The content and call deltas that `text` (the next piece of output) completes."""

    @property
    @abstractmethod
    def called(self) -> bool:
        """Whether any tool call was read so far."""

    def parse(self, text: str) -> ParsedOutput:
        """A whole output (on a fresh parser)."""
        delta = self.feed(text, final=True)
        calls: dict[int, ToolCall] = {}
        for d in delta.calls:
            known = calls.get(d.index)
            calls[d.index] = ToolCall(d.id or "", d.name or "", d.arguments) if known is None else \
                ToolCall(known.id, known.name, known.arguments + d.arguments)
        content = delta.content if delta.content or not calls else None
        return ParsedOutput(content, tuple(calls[i] for i in sorted(calls)))
