"""Tool calling in OpenAI's JSON: `tools` and `tool_choice` become the core's ToolUse (bad
ones are 400 naming the field), and the output's `<tool_call>` blocks come back as
`message.tool_calls` or streamed `delta.tool_calls` with finish_reason tool_calls."""

import json

import pytest

from specdec.requests.stats import SpecStats
from specdec.serving.frontend import Completion, Delta, Usage
from specdec.serving.serving_errors import InvalidRequestError
from specdec.serving.tool_parser_hermes import HermesToolParser, call_block
from specdec_http.openai_api import chat_request
from specdec_http.openai_responses import Call, UsageReport, chunk_events, completion_object, error_body
from specdec_http.tool_calls import tool_parser

MODEL = "bundled:target"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
PING = {"type": "function", "function": {"name": "ping"}}
USER = [{"role": "user", "content": "weather in Paris?"}]
OUTPUT = "Let me check.\n" + call_block("get_weather", '{"city": "Paris"}') + "\n" + call_block("ping", "{}")


def chat(**fields):
    return chat_request({"model": MODEL, "messages": USER, **fields}, MODEL)[0]


def test_tools_and_the_choice_reach_the_core():
    tools = chat(tools=[WEATHER, PING]).tools
    assert [t.name for t in tools.tools] == ["get_weather", "ping"] and tools.choice == "auto"
    assert tools.tools[0].parameters == WEATHER["function"]["parameters"]
    named = chat(tools=[WEATHER, PING], tool_choice={"type": "function", "function": {"name": "ping"}}).tools
    assert (named.choice, named.name) == ("named", "ping")
    assert chat(tools=[WEATHER], tool_choice="required").tools.choice == "required"
    assert chat().tools is None and chat(tool_choice="none").tools is None and chat(tools=[]).tools is None


def test_a_history_with_calls_and_results_is_accepted():
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]
    request, _ = chat_request({"messages": messages, "tools": [WEATHER]}, MODEL)
    assert request.messages[1]["tool_calls"] == [call] and request.messages[2]["tool_call_id"] == "call_9"


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "required", "tools": []}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "a b"}}]}, "tools[1].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "colour": "red"}}]}, "tools[0].function"),
    ({"tools": "get_weather"}, "tools"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_400_naming_the_field(fields, param):
    with pytest.raises(InvalidRequestError) as error:
        chat(**fields)
    assert error.value.param == param
    status, body = error_body(*_kind(error.value))
    assert status == 400 and body["error"]["param"] == param


def _kind(exc):
    from specdec.serving.serving_errors import classify
    return classify(exc), str(exc), exc


def completion(text, reason="stop") -> Completion:
    return Completion("req-1", text, [1, 2], reason, SpecStats(rounds=1), Usage(3, 2))


def test_a_unary_answer_that_calls_tools_has_tool_calls_and_finish_reason_tool_calls():
    call = Call.new(chat=True, model=MODEL)
    [choice] = completion_object(call, completion(OUTPUT), tools=[HermesToolParser()])["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] == "Let me check."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] \
        == [("function", "get_weather", {"city": "Paris"}), ("function", "ping", {})]
    assert all(c["id"].startswith("call_") for c in message["tool_calls"])


def test_an_answer_without_calls_is_plain_content_and_a_cut_one_keeps_length():
    call = Call.new(chat=True, model=MODEL)
    [plain] = completion_object(call, completion("def f(): pass"), tools=[HermesToolParser()])["choices"]
    assert plain["message"] == {"role": "assistant", "content": "def f(): pass"} and plain["finish_reason"] == "stop"
    [cut] = completion_object(call, completion(OUTPUT, "length"), tools=[HermesToolParser()])["choices"]
    assert cut["finish_reason"] == "length" and len(cut["message"]["tool_calls"]) == 2


def test_a_stream_sends_tool_call_deltas_with_no_markup_in_the_content():
    call, parser = Call.new(chat=True, model=MODEL), HermesToolParser()
    pieces = [OUTPUT[:20], OUTPUT[20:40], OUTPUT[40:75], OUTPUT[75:]]
    chunks = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        delta = Delta(piece, [1], "stop" if last else None, SpecStats(rounds=1) if last else None)
        events = chunk_events(call, delta, i == 0, UsageReport(), tools=parser)
        chunks += [json.loads(e[len("data: "):]) for e in events]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check."
    calls = {}
    for d in (d for delta in deltas for d in delta.get("tool_calls", [])):
        if "id" in d:
            calls[d["index"]] = {"id": d["id"], "name": d["function"]["name"], "arguments": ""}
        calls[d["index"]]["arguments"] += d["function"]["arguments"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}), ("ping", {})]


def test_only_a_request_with_tools_it_may_call_is_read_for_calls():
    def no_tokenizer():
        raise AssertionError("a request without tools never needs the model's tool format")

    assert tool_parser(chat(), no_tokenizer) is None
    assert tool_parser(chat(tools=[WEATHER], tool_choice="none"), no_tokenizer) is None
    assert isinstance(tool_parser(chat(tools=[WEATHER]), lambda: None), HermesToolParser)
