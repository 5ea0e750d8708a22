"""Tool calling over HTTP on the real bundled model (uvicorn on 127.0.0.1), with the official
client and LangChain's `bind_tools`.

With tool_choice auto the tiny model writes Python, not calls; so the proof is that the
answer is exactly the model's (seeded) output for the prompt with the tools in the bundled
pair's format, read by the Hermes parser (content, or tool_calls when it wrote a block),
unary and streamed, and that a history of calls and tool results round-trips. Forcing a
call (tool_choice required / named) needs the grammar engine: those tests run once it is
in the tree (specdec/sampling/grammar_*.py).
"""

from __future__ import annotations

import json
import pkgutil

import openai
import pytest

import specdec.sampling
from specdec.requests.request import DEFAULT_CAPS
from openai_http import post, served_http, sse_lines
from specdec.serving.chat_template import check_messages, render_chat
from specdec.serving.tool_parser_hermes import HermesToolParser
from specdec.serving.tool_spec import Tool, ToolUse

MODEL = "bundled:target"
UNIT = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"]}
WEATHER = {"type": "function",
           "function": {"name": "get_weather", "description": "The weather now", "parameters": UNIT}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"unit": "celsius"}'}}
HISTORY = [{"role": "user", "content": "What is the weather?"},
           {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]
GRAMMAR_ENGINE = any(m.name.startswith("grammar_") for m in pkgutil.iter_modules(specdec.sampling.__path__))
needs_grammar = pytest.mark.skipif(not GRAMMAR_ENGINE, reason="forcing calls needs the grammar engine")


@pytest.fixture(scope="module")
def server():
    # the tool list alone is ~250 tokens: a context beyond the other servers' 256
    with served_http({"cache": {"num_slots": 2, "max_seq_len": 1024}}) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120.0) as client:
        yield client


SAMPLING = {"temperature": 1.0, "seed": 11}  # seeded: the output depends on every token of the prompt


def model_output(server, tokenizer, messages, max_tokens, tools=None) -> str:
    """The model's (seeded) text for the chat prompt with `tools` (WEATHER) offered, through
    /v1/completions: what a chat answer is read from."""
    tools = tools or ToolUse((Tool.of("get_weather", "The weather now", UNIT, "tools[0]"),), "auto")
    prompt = render_chat(tokenizer, check_messages(messages), tools=tools)
    status, body = post(server.url, "/v1/completions",
                        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **SAMPLING})
    assert status == 200, body
    return body["choices"][0]["text"]


def test_a_unary_answer_is_the_models_output_read_for_calls(client, server, tokenizer):
    expected = HermesToolParser().parse(model_output(server, tokenizer, HISTORY, 12))
    choice = client.chat.completions.create(model=MODEL, messages=HISTORY, tools=[WEATHER], max_tokens=12,
                                            **SAMPLING).choices[0]
    assert choice.message.content == expected.content
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == [
        (c.name, c.arguments) for c in expected.calls]
    assert choice.finish_reason in (("tool_calls",) if expected.calls else ("stop", "length"))


def test_a_stream_adds_up_to_the_same_answer_without_markup_in_its_content(server, tokenizer):
    expected = HermesToolParser().parse(model_output(server, tokenizer, HISTORY, 12))
    body = {"model": MODEL, "messages": HISTORY, "tools": [WEATHER], "max_tokens": 12, **SAMPLING}
    chunks = [json.loads(line) for line in sse_lines(server.url, "/v1/chat/completions", body)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == (expected.content or "") and "<tool_call>" not in content
    assert sum(len(d.get("tool_calls") or []) for d in deltas) >= len(expected.calls)
    assert chunks[-1]["choices"][0]["finish_reason"] in (("tool_calls",) if expected.calls else ("stop", "length"))


def test_tool_choice_none_answers_as_without_tools(client):
    plain = client.chat.completions.create(model=MODEL, messages=HISTORY[:1], max_tokens=8, temperature=0)
    none = client.chat.completions.create(model=MODEL, messages=HISTORY[:1], tools=[WEATHER], tool_choice="none",
                                          max_tokens=8, temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_400_naming_the_field_over_http(server, fields, param):
    status, body = post(server.url, "/v1/chat/completions", {"model": MODEL, "messages": HISTORY[:1], **fields})
    assert status == 400 and body["error"]["param"] == param


def langchain_model(server, **kwargs):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                                       timeout=120, **{"temperature": 0, **kwargs})


def get_weather(unit: str) -> str:
    """The weather now, in celsius or fahrenheit."""
    return "20 degrees"


def langchain_history():
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    call = {"name": "get_weather", "args": {"unit": "celsius"}, "id": "call_1", "type": "tool_call"}
    return [HumanMessage("What is the weather?"), AIMessage("", tool_calls=[call]),
            ToolMessage("20 degrees", tool_call_id="call_1")]


def test_langchain_bind_tools_round_trips_a_tool_result(server, tokenizer):
    from langchain_core.messages import AIMessage

    answer = langchain_model(server, max_tokens=12, **SAMPLING).bind_tools([get_weather]).invoke(langchain_history())
    assert isinstance(answer, AIMessage) and answer.invalid_tool_calls == []
    schema = {"properties": {"unit": {"type": "string"}}, "required": ["unit"], "type": "object"}  # LangChain's
    tools = ToolUse((Tool.of("get_weather", get_weather.__doc__, schema, "tools[0]"),), "auto")
    expected = HermesToolParser().parse(model_output(server, tokenizer, HISTORY, 12, tools))
    assert answer.content == (expected.content or "")
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == [(c.name, json.loads(c.arguments))
                                                                   for c in expected.calls]


@needs_grammar
def test_langchain_with_a_named_tool_gets_a_call_whose_arguments_match_the_schema(server):
    jsonschema = pytest.importorskip("jsonschema")
    model = langchain_model(server, max_tokens=64).bind_tools([WEATHER], tool_choice="get_weather")
    for answer in (model.invoke("What is the weather?"), _streamed(model, "What is the weather?")):
        [call] = answer.tool_calls
        assert call["name"] == "get_weather" and call["id"].startswith("call_")
        jsonschema.validate(call["args"], UNIT)


def _streamed(model, prompt):
    chunks = list(model.stream(prompt))
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


@needs_grammar
def test_tool_choice_required_streams_calls_with_speculation_on(client):
    stream = client.chat.completions.create(model=MODEL, messages=HISTORY[:1], tools=[WEATHER],
                                            tool_choice="required", max_tokens=64, temperature=0, stream=True,
                                            extra_body={"speculation": {"mode": "on"}})
    calls, finish = {}, None
    for chunk in stream:
        choice = chunk.choices[0]
        assert not (choice.delta.content or "").strip()
        for d in choice.delta.tool_calls or []:
            calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})["arguments"] += d.function.arguments
        finish = choice.finish_reason or finish
    # required allows more calls after the first: the tiny model keeps writing them until
    # max_tokens (finish "length", its last call possibly cut); the first is always whole
    assert finish in ("tool_calls", "length") and calls and all(c["name"] == "get_weather" for c in calls.values())
    whole = list(calls.values()) if finish == "tool_calls" else list(calls.values())[:1]
    for c in whole:
        assert json.loads(c["arguments"])["unit"] in ("celsius", "fahrenheit")


@needs_grammar
def test_required_with_parallel_tool_calls_false_answers_exactly_one_whole_call(client):
    answer = client.chat.completions.create(model=MODEL, messages=HISTORY[:1], tools=[WEATHER],
                                            tool_choice="required", parallel_tool_calls=False, max_tokens=128,
                                            temperature=0, extra_body={"speculation": {"mode": "on"}})
    choice = answer.choices[0]
    [call] = choice.message.tool_calls  # the grammar ends the output after one block (~80 tokens)
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")


def test_parallel_tool_calls_false_leaves_the_client_every_stop_string_the_server_allows(client):
    # the server ends a one-call output with a stop string of its own, which the client's
    # limit (generation.max_stop_strings) does not count
    stops = [f"@stop{i}@" for i in range(DEFAULT_CAPS.max_stop_strings)]
    ask = {"model": MODEL, "messages": HISTORY, "tools": [WEATHER], "max_tokens": 12, **SAMPLING}
    one = client.chat.completions.create(**ask, parallel_tool_calls=False, stop=stops).choices[0]
    assert one.message.content == client.chat.completions.create(**ask).choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="stop strings exceed the limit"):
        client.chat.completions.create(**ask, parallel_tool_calls=False, stop=stops + ["@more@"])
