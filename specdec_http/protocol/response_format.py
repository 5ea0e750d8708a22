"""Structured output in the request bodies: OpenAI's `response_format` and the
`structured_outputs` extension (as vLLM's: one of json, regex, grammar).

`response_format`: {"type": "text"} (free text, the default), {"type": "json_object"} (any
JSON object), {"type": "json_schema", "json_schema": {"name", "description", "schema",
"strict"}} (an object matching the schema; the output always follows it: strict or not, a
grammar enforces it). `structured_outputs` (extension): exactly one of `json` (a JSON schema,
as an object or JSON text), `regex` (a regular expression the whole output matches) or
`grammar` (an EBNF grammar in xgrammar's dialect, rule `root` first). One of the two per
request. `specdec_http.openai_structured` maps them to the core's `GrammarSpec`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specdec_http.protocol.fields import Bool


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema: the schema the output must match."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Annotated[str, Field(strict=True, max_length=64)] = Field(description="the schema's name (as OpenAI)")
    description: Annotated[str, Field(strict=True)] | None = Field(None, description="what the output is for")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="the JSON schema (left out: any object)")
    strict: Bool | None = Field(None, description="accepted; the schema is always enforced (by a grammar)")


class TextFormat(BaseModel):
    """{"type": "text"}: free text (the default)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    """{"type": "json_object"}: the output is a JSON object."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_object"]


class JsonSchemaResponseFormat(BaseModel):
    """{"type": "json_schema", "json_schema": {...}}: the output is a JSON object matching the schema."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")]


class StructuredOutputs(BaseModel):
    """The `structured_outputs` extension (as vLLM's): exactly one of json, regex, grammar."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | Annotated[str, Field(strict=True)] | None = Field(
        None, alias="json", description="a JSON schema (an object, or JSON text) the output matches")
    regex: Annotated[str, Field(strict=True, min_length=1)] | None = Field(
        None, description="a regular expression the whole output matches")
    grammar: Annotated[str, Field(strict=True, min_length=1)] | None = Field(
        None, description="an EBNF grammar (xgrammar's dialect; rule root first) the output matches")

    @model_validator(mode="after")
    def _one(self) -> "StructuredOutputs":
        if sum(v is not None for v in (self.json_, self.regex, self.grammar)) != 1:
            raise ValueError("set exactly one of json, regex and grammar")
        return self
