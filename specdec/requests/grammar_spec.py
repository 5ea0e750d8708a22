"""What a request's output must match: a grammar that masks the target's distribution.

The core only carries the spec; specdec.sampling's grammar matcher compiles and enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.requests.errors import InvalidRequestError

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf")


@dataclass(frozen=True)
class GrammarSpec:
    """kind: "json_object" (any JSON object), "json_schema" (text: the schema, as JSON text),
        "regex" (text: the pattern), "ebnf" (text: a grammar in the engine's EBNF dialect).
    text: the schema, pattern or grammar ("" for json_object).
    """

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise InvalidRequestError("grammar.kind", f"must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        if self.kind != "json_object" and not (isinstance(self.text, str) and self.text.strip()):
            raise InvalidRequestError("grammar.text", f"a {self.kind} grammar needs its text")
