"""`response_format` and `structured_outputs` (`protocol.response_format`) to the core's
`GrammarSpec`, checked here so that a grammar that does not compile is a 400 naming the field
the client wrote (`response_format.json_schema.schema`, `structured_outputs.regex`).
"""

from __future__ import annotations

import json
from typing import Any

from specdec.requests.errors import InvalidRequestError
from specdec.requests.grammar_spec import GrammarSpec
from specdec.sampling.grammar_matcher import GrammarError
from specdec.sampling.grammar_xgrammar import parsed_grammar
from specdec_http.protocol.response_format import JsonObjectFormat, JsonSchemaResponseFormat


def grammar_of(request: Any) -> GrammarSpec | None:
    """The grammar a request's output must match (None = free text); InvalidRequestError
    naming the field when both are set or the grammar does not compile."""
    response_format, structured = request.response_format, request.structured_outputs
    if structured is not None and response_format is not None and response_format.type != "text":
        raise InvalidRequestError("structured_outputs", "set either response_format or structured_outputs, not both")
    if structured is not None:
        return _checked(*_structured(structured))
    if isinstance(response_format, JsonObjectFormat):
        return _checked(GrammarSpec("json_object"), "response_format")
    if isinstance(response_format, JsonSchemaResponseFormat):
        schema = response_format.json_schema.schema_
        if schema is None:  # OpenAI's schema is optional: any object then
            return _checked(GrammarSpec("json_object"), "response_format.json_schema")
        return _checked(GrammarSpec("json_schema", json.dumps(schema)), "response_format.json_schema.schema")
    return None


def _structured(structured: Any) -> tuple[GrammarSpec, str]:
    """(the spec, the field it came from) of a structured_outputs object (exactly one set)."""
    if structured.regex is not None:
        return GrammarSpec("regex", structured.regex), "structured_outputs.regex"
    if structured.grammar is not None:
        return GrammarSpec("ebnf", structured.grammar), "structured_outputs.grammar"
    schema = structured.json_
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return GrammarSpec("json_schema", text), "structured_outputs.json"


def _checked(spec: GrammarSpec, param: str) -> GrammarSpec:
    """The spec, once it compiles; else InvalidRequestError naming `param`."""
    try:
        parsed_grammar(spec)
    except GrammarError as exc:
        raise InvalidRequestError(param, exc.reason) from None
    return spec
