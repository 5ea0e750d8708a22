"""Offered tools and tool_choice are checked at entry: every refusal names the field as the
client sent it."""

import pytest

from specdec.serving.serving_errors import InvalidRequestError
from specdec.serving.tool_spec import Tool, ToolUse

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def tool(name="get_weather", parameters=WEATHER, where="tools[0]"):
    return Tool.of(name, "the weather", parameters, where)


def test_a_tool_keeps_its_schema_and_writes_itself_as_openai_does():
    t = tool()
    assert t.parameters == WEATHER
    assert t.as_openai() == {"type": "function",
                             "function": {"name": "get_weather", "description": "the weather", "parameters": WEATHER}}
    assert Tool.of("ping", None, None, "tools[1]").parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize("name, parameters, param", [
    ("bad name", WEATHER, "tools[2].function.name"),
    ("x" * 65, WEATHER, "tools[2].function.name"),
    ("", WEATHER, "tools[2].function.name"),
    ("f", [1], "tools[2].function.parameters"),
    ("f", {"type": "string"}, "tools[2].function.parameters"),
    ("f", {"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "tools[2].function.parameters"),
    ("f", {"type": "object", "required": "city"}, "tools[2].function.parameters"),
])
def test_a_bad_tool_is_refused_naming_its_field(name, parameters, param):
    with pytest.raises(InvalidRequestError) as error:
        tool(name, parameters, "tools[2]")
    assert error.value.param == param


@pytest.mark.parametrize("tools, choice, name, param", [
    ((), "auto", None, "tools"),
    (("a", "b", "a"), "auto", None, "tools[2].function.name"),
    (("a", "b"), "named", "c", "tool_choice.function.name"),
    (("a",), "sometimes", None, "tool_choice"),
])
def test_a_bad_tool_use_is_refused_naming_its_field(tools, choice, name, param):
    with pytest.raises(InvalidRequestError) as error:
        ToolUse(tuple(Tool(n) for n in tools), choice, name)
    assert error.value.param == param


def test_what_each_choice_allows():
    tools = (Tool("a"), Tool("b"))
    assert [ToolUse(tools, c).calls_allowed for c in ("none", "auto", "required")] == [False, True, True]
    assert [ToolUse(tools, c).forced for c in ("none", "auto", "required")] == [False, False, True]
    named = ToolUse(tools, "named", "b")
    assert named.forced and named.callable == (Tool("b"),) and ToolUse(tools, "required").callable == tools
