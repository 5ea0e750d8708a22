"""The committed JSON schema is the one the protocol models generate, and every response the
server builds validates against its model (so the schema describes what is sent)."""

import json

from specdec.serving.frontend import Completion, Delta, Usage
from specdec.requests.stats import SpecStats
from specdec_http.openai_responses import Call, UsageReport, chunk_events, completion_object
from specdec_http.protocol import schema
from specdec_http.protocol.chunks import ChatCompletionChunk, CompletionChunk
from specdec_http.protocol.responses import ChatCompletionResponse, CompletionResponse
from specdec_http.protocol.requests import CompletionRequest

MODEL = "bundled:target"


def test_the_committed_schema_is_up_to_date():
    assert schema.SCHEMA_PATH.read_text() == schema.render(), "run: python -m specdec_http.protocol.schema"
    assert schema.main(["--check"]) == 0


def test_the_schema_names_each_routes_request_response_and_chunk():
    document = json.loads(schema.render())
    route = document["paths"]["POST /v1/completions"]
    assert route["request"] == {"$ref": "#/$defs/CompletionRequest"}
    assert route["stream_chunk"] == {"$ref": "#/$defs/CompletionChunk"}
    fields = document["$defs"]["CompletionRequest"]["properties"]
    assert "prompt" in fields and "speculation" in fields and "neutral" in fields["suffix"]["description"]
    assert document["$defs"]["CompletionRequest"]["additionalProperties"] is False  # unknown fields are refused


def test_an_ignored_openai_field_is_accepted_by_the_request_model():
    assert CompletionRequest.model_validate({"prompt": "x", "metadata": {"a": 1}}).metadata == {"a": 1}


def _completion() -> Completion:
    return Completion("r", "hi", [1, 2], "stop", SpecStats(rounds=1, drafted=2, accepted=1, emitted=2, gamma=2),
                      Usage(3, 2))


def test_the_responses_and_chunks_sent_validate_against_their_models():
    for chat, response, chunk in ((False, CompletionResponse, CompletionChunk),
                                  (True, ChatCompletionResponse, ChatCompletionChunk)):
        call = Call.new(chat=chat, model=MODEL)
        response.model_validate(completion_object(call, _completion()))
        last = Delta("x", [3], "length", SpecStats(rounds=1), Usage(3, 1))
        report = UsageReport(final=True, continuous=True)
        for event in chunk_events(call, Delta("a", [1], usage=Usage(3, 1)), True, report) + \
                chunk_events(call, last, False, report):
            chunk.model_validate_json(event.removeprefix("data: "))
