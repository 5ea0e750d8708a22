"""Structured output over HTTP (uvicorn on 127.0.0.1, in-process bundled pair, speculating at a
static γ): `response_format` json_object and json_schema on chat and completions, the
`structured_outputs` extension (json, regex, grammar), streamed alike; a grammar that does
not compile is a 400 naming the field; and the LangChain proof: `with_structured_output` of
a pydantic model, 48 sampled requests (temperature 1) sent 16 at a time, so that the
server's 16 slots decode grammar-constrained rows batched together, every one a valid object."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel, Field

from openai_http import UvicornThread, post, sse_lines
from specdec.config.config import load_config
from specdec.serving.frontend import Frontend
from specdec.wiring.engine_builder import build_served_engine
from specdec.wiring.ports import free_port
from specdec_http.http_api import HttpApi, asgi_app

MODEL = "bundled:target"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                           "maximum": 99}},
          "required": ["ok", "n"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
ON, OFF = {"mode": "on"}, {"mode": "off"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 24}


@pytest.fixture(scope="module")
def server():
    served = build_served_engine(load_config(overrides={
        "cache": {"num_slots": 16, "max_seq_len": 256}, "load_monitor": {"enabled": False},
        "speculation": {"proposer": "draft", "gamma": 4}}))
    with UvicornThread(asgi_app(HttpApi(Frontend(served))), free_port()) as server:
        yield server
    served.close()


def answer(server, path: str, body: dict) -> dict:
    status, reply = post(server.url, path, body)
    assert status == 200, reply
    return reply["choices"][0]


def test_chat_json_schema_is_followed_and_speculation_changes_nothing(server):
    body = {**CHAT, "response_format": JSON_SCHEMA, "temperature": 0}
    on = answer(server, "/v1/chat/completions", {**body, "speculation": ON})
    off = answer(server, "/v1/chat/completions", {**body, "speculation": OFF})
    assert on["message"]["content"] == off["message"]["content"]
    value = json.loads(on["message"]["content"])
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and on["finish_reason"] == "stop"


def test_completions_json_object_is_a_json_object(server):
    choice = answer(server, "/v1/completions", {"model": MODEL, "prompt": "{", "max_tokens": 48, "temperature": 1,
                                                "seed": 3, "response_format": {"type": "json_object"}})
    assert choice["finish_reason"] == "length" or isinstance(json.loads(choice["text"]), dict)


@pytest.mark.parametrize("structured, pattern", [
    ({"regex": "(cat|dog)-[0-9]{2}"}, "(cat|dog)-[0-9]{2}"),
    ({"grammar": 'root ::= "x" [a-c] [a-c]?'}, "x[a-c]{1,2}"),
    ({"json": json.dumps({"type": "string", "enum": ["red", "blue"]})}, '"(red|blue)"'),
], ids=["regex", "grammar", "json"])
def test_the_structured_outputs_extension_constrains_completions(server, structured, pattern):
    choice = answer(server, "/v1/completions", {"model": MODEL, "prompt": "pet:", "max_tokens": 16, "temperature": 1,
                                                "structured_outputs": structured, "speculation": ON})
    assert re.fullmatch(pattern, choice["text"]) and choice["finish_reason"] == "stop"


def test_a_streamed_structured_output_is_the_same_json(server):
    body = {**CHAT, "response_format": JSON_SCHEMA, "temperature": 0, "speculation": ON}
    chunks = [json.loads(line) for line in sse_lines(server.url, "/v1/chat/completions", body)[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == answer(server, "/v1/chat/completions", body)["message"]["content"]
    json.loads(text)


@pytest.mark.parametrize("field, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objectx"}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "grammar": "root ::= \"a\""}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ({"response_format": {"type": "xml"}}, "response_format"),
])
def test_a_grammar_that_cannot_be_followed_is_400_naming_its_field(server, field, param):
    status, body = post(server.url, "/v1/chat/completions", {**CHAT, **field})
    assert status == 400 and body["error"]["param"] == param


class Pet(BaseModel):
    """The LangChain proof's tiny schema (a closed JSON object of a few tokens)."""

    kind: str = Field(max_length=5)
    legs: int = Field(ge=0, le=8)
    tame: bool


#: the LangChain proof's requests, sent CONCURRENT at a time (= the server's slots): three full batches
SAMPLED, CONCURRENT = 48, 16


@pytest.mark.slow
def test_langchain_with_structured_output_returns_valid_objects_in_48_concurrent_sampled_requests(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="unused", temperature=1.0, max_tokens=48,
                     max_retries=0, timeout=120, extra_body={"speculation": ON})
    structured = llm.with_structured_output(Pet, include_raw=True)
    prompts = [f"Describe pet number {i} as JSON." for i in range(SAMPLED)]
    replies = structured.batch(prompts, config={"max_concurrency": CONCURRENT})
    assert all(r["parsing_error"] is None and isinstance(r["parsed"], Pet) for r in replies), [
        r["raw"].content for r in replies if r["parsing_error"] is not None][:3]
    assert len({r["raw"].content for r in replies}) > SAMPLED // 8, "sampled at temperature 1: the objects differ"
