"""The JSON schema of the OpenAI protocol this server speaks, generated from its models.

    python -m specdec_http.protocol.schema          writes docs/openai_schema.json
    python -m specdec_http.protocol.schema --check  exits 1 when the file is out of date

One schema document: `$defs` holds every request, response, chunk and error model, and
`paths` says which route takes and gives which (tests check the committed file is current).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from specdec_http.protocol.chunks import ChatCompletionChunk, CompletionChunk
from specdec_http.protocol.errors import ErrorResponse
from specdec_http.protocol.models import ModelList
from specdec_http.protocol.requests import ChatCompletionRequest, CompletionRequest
from specdec_http.protocol.responses import ChatCompletionResponse, CompletionResponse

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "openai_schema.json"
#: route -> (request model, response model, stream chunk model); None where there is none
ROUTES = {
    "POST /v1/completions": (CompletionRequest, CompletionResponse, CompletionChunk),
    "POST /v1/chat/completions": (ChatCompletionRequest, ChatCompletionResponse, ChatCompletionChunk),
    "GET /v1/models": (None, ModelList, None),
}


def openai_schema() -> dict[str, Any]:
    """The schema document (requests in validation mode, responses as serialised)."""
    models = [(m, "validation") for m in (CompletionRequest, ChatCompletionRequest)]
    models += [(m, "serialization") for m in (CompletionResponse, ChatCompletionResponse, CompletionChunk,
                                                ChatCompletionChunk, ModelList, ErrorResponse)]
    refs, schema = models_json_schema(models, ref_template="#/$defs/{model}")
    paths = {}
    for route, (request, response, chunk) in ROUTES.items():
        paths[route] = {
            "request": None if request is None else refs[(request, "validation")],
            "response": refs[(response, "serialization")],
            "stream_chunk": None if chunk is None else refs[(chunk, "serialization")],
            "error": refs[(ErrorResponse, "serialization")],
        }
    return {"title": "specdec OpenAI-compatible API", "paths": paths, **schema}


def render() -> str:
    return json.dumps(openai_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        current = SCHEMA_PATH.read_text() if SCHEMA_PATH.exists() else ""
        if current != text:
            print(f"{SCHEMA_PATH} is out of date: run python -m specdec_http.protocol.schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.write_text(text)
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
