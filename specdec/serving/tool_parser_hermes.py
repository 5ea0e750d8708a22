"""The Hermes/Qwen tool-call format: each call a JSON object in `<tool_call>` tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

as Hermes 2/3, Qwen 2.5/3 and the bundled pair (`specdec.serving.tool_format`) write them.
A block whose JSON is an object with a string `name` and an object `arguments` (or
`parameters`; arguments given as JSON text are read too) is a call; any other block stays
in the content verbatim, tags included; so does the text around the blocks (whitespace
next to a call is dropped). A block left open at the end (the budget ran out, or the model
stopped early) is read the same way.

Streaming: text outside blocks goes out as content at once (a possible start of a tag is
held back until it is decided); a whole block within one piece is read whole; a block that
is still open once its head (`{"name": "...", "arguments": `) and an object's `{` are in
goes out incrementally: the call's name first, then its arguments' JSON text as it arrives
(up to where that object closes). Such a call's head was already announced, so it stays a
call even if its block turns out malformed later (the one place a stream may read otherwise
than the whole output).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from specdec.serving.tool_parser import ParsedDelta, ToolCallDelta, ToolParser, new_call_id

START, END = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


def call_block(name: str, arguments: str) -> str:
    """A call (arguments: JSON text of an object) as a Hermes block."""
    call = {"name": name, "arguments": json.loads(arguments)}
    return f"{START}\n{json.dumps(call, ensure_ascii=False)}\n{END}"


def read_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a block's body; None when it is no call."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return call["name"], json.dumps(arguments, ensure_ascii=False)


class _ObjectEnd:
    """Where a JSON object's text ends, read piece by piece (strings and escapes skipped)."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped, self.done = 0, False, False, False

    def take(self, text: str) -> int:
        """How many characters of `text` still belong to the object."""
        for i, ch in enumerate(text):
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (ch == "\\", ch != '"')
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


class HermesToolParser(ToolParser):
    """One request's reader of Hermes `<tool_call>` blocks (see the module's docstring)."""

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self.new_id = new_id
        self.buffer = ""  # output not yet decided
        self.in_block = False  # after a START, before its END
        self.arguments: _ObjectEnd | None = None  # the open block's call, streaming its arguments
        self.calls = 0  # calls read so far
        self.held = ""  # whitespace content held back (dropped if a call follows)

    @property
    def called(self) -> bool:
        return self.calls > 0

    def feed(self, text: str, final: bool = False) -> ParsedDelta:
        self.buffer += text
        out = ParsedDelta()
        while self._step(out, final):
            pass
        if final and not self.called:
            out.content += self.held  # a plain answer keeps its whitespace
            self.held = ""
        return out

    def _step(self, out: ParsedDelta, final: bool) -> bool:
        """Decide what can be decided at the head of the buffer; False when nothing more can."""
        if not self.in_block:
            return self._outside(out, final)
        if self.arguments is not None:
            return self._streaming(out, final)
        end = self.buffer.find(END)
        if end >= 0 or final:  # a whole block (or the last, open one): read at once
            body, self.buffer = (self.buffer[:end], self.buffer[end + len(END):]) if end >= 0 else (self.buffer, "")
            self.in_block = False
            self._block(out, body, closed=end >= 0)
            return True
        head = _HEAD.match(self.buffer)
        if head is None:
            return False
        try:
            name = json.loads(f'"{head.group(1)}"')
        except ValueError:  # a bad escape in the name: decided when the block is whole
            return False
        self._announce(out, name, "")
        self.arguments, self.buffer = _ObjectEnd(), self.buffer[head.end():]
        return True

    def _outside(self, out: ParsedDelta, final: bool) -> bool:
        start = self.buffer.find(START)
        if start >= 0:
            self._content(out, self.buffer[:start])
            self.buffer, self.in_block = self.buffer[start + len(START):], True
            return True
        keep = 0 if final else _partial_tag(self.buffer)
        self._content(out, self.buffer[:len(self.buffer) - keep])
        self.buffer = self.buffer[len(self.buffer) - keep:]
        return False

    def _streaming(self, out: ParsedDelta, final: bool) -> bool:
        """The open call's arguments, up to where its object closes; then on to its END."""
        scanner = self.arguments
        if not scanner.done:
            end = self.buffer.find(END)
            piece = self.buffer if end < 0 else self.buffer[:end]
            taken = scanner.take(piece)
            if taken:
                out.add_call(ToolCallDelta(self.calls - 1, piece[:taken]))
            self.buffer = self.buffer[taken:]
            if not scanner.done and end < 0:
                return False
        end = self.buffer.find(END)
        if end < 0:
            self.buffer = "" if final else self.buffer[-len(END):]  # what follows the object is no content
            return False
        self.buffer, self.in_block, self.arguments = self.buffer[end + len(END):], False, None
        return True

    def _block(self, out: ParsedDelta, body: str, closed: bool) -> None:
        call = read_call(body)
        if call is None:
            self._content(out, START + body + (END if closed else ""))
        else:
            self._announce(out, *call)

    def _announce(self, out: ParsedDelta, name: str, arguments: str) -> None:
        self.held = ""
        out.add_call(ToolCallDelta(self.calls, arguments, self.new_id(), name))
        self.calls += 1

    def _content(self, out: ParsedDelta, text: str) -> None:
        """Content, but whitespace at its end waits: it goes out with more content, or is
        dropped when a call follows."""
        text = self.held + text
        body = text.rstrip()
        out.content += body
        self.held = text[len(body):]


def _partial_tag(text: str) -> int:
    """The length of the longest end of `text` that could start a START tag."""
    for n in range(min(len(text), len(START) - 1), 0, -1):
        if START.startswith(text[-n:]):
            return n
    return 0
