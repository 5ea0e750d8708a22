"""tool_choice required / named become a grammar over the output: Hermes `<tool_call>` blocks
of the allowed tools whose arguments match their schemas, and nothing else. (Enforcing it
while sampling is the grammar engine's; here the grammar itself is checked.)"""

import json

import pytest

from specdec.requests.grammar_spec import GrammarSpec
from specdec.serving.tool_grammar import call_schema, tool_grammar
from specdec.serving.tool_parser_hermes import HermesToolParser, call_block
from specdec.serving.tool_spec import Tool, ToolUse

xgrammar = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

TOOLS = (Tool.of("get_weather", "", {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                                     "required": ["unit"]}, "tools[0]"),
         Tool.of("add", "", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"]}, "tools[1]"))
WEATHER = call_block("get_weather", '{"unit": "celsius"}')
ADD = call_block("add", '{"a": 1, "b": -2}')


def grammar(choice, name=None, parallel=True):
    spec = tool_grammar(ToolUse(TOOLS, choice, name, parallel))
    assert isinstance(spec, GrammarSpec) and spec.kind == "ebnf" and spec.text.startswith("root ::= ")
    return xgrammar.Grammar.from_ebnf(spec.text)


def test_no_grammar_unless_calls_are_forced():
    assert tool_grammar(None) is None
    assert tool_grammar(ToolUse(TOOLS, "auto")) is None and tool_grammar(ToolUse(TOOLS, "none")) is None


def test_required_takes_one_or_more_calls_of_any_tool_with_valid_arguments():
    required = grammar("required")
    assert accepts(required, WEATHER) and accepts(required, ADD) and accepts(required, f"{ADD}\n{WEATHER}")
    for bad in ("", "The weather is fine.", call_block("get_weather", '{"unit": "kelvin"}'),
                call_block("add", '{"a": 1}'), call_block("subtract", '{"a": 1, "b": 2}'),
                f"{WEATHER} and more text", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'):
        assert not accepts(required, bad), bad


def test_a_named_tool_takes_exactly_one_call_of_that_tool():
    named = grammar("named", "get_weather")
    assert accepts(named, WEATHER)
    assert not accepts(named, ADD) and not accepts(named, f"{WEATHER}\n{WEATHER}")


def test_required_without_parallel_calls_takes_exactly_one_call_of_any_tool():
    one = grammar("required", parallel=False)
    assert accepts(one, WEATHER) and accepts(one, ADD)
    assert not accepts(one, f"{ADD}\n{WEATHER}") and not accepts(one, "")


def test_what_the_grammar_accepts_reads_back_as_the_calls():
    parsed = HermesToolParser().parse(f"{ADD}\n{WEATHER}")
    assert parsed.content is None and [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("add", {"a": 1, "b": -2}), ("get_weather", {"unit": "celsius"})]


def test_the_call_schema_validates_a_good_call_and_rejects_bad_ones():
    jsonschema = pytest.importorskip("jsonschema")
    schema = call_schema(ToolUse(TOOLS, "required"))
    jsonschema.validate({"name": "add", "arguments": {"a": 1, "b": 2}}, schema)
    for bad in ({"name": "add", "arguments": {"a": "1", "b": 2}}, {"name": "nope", "arguments": {}},
                {"name": "get_weather", "arguments": {"unit": "celsius"}, "extra": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_a_schema_that_names_root_in_its_strings_keeps_them():
    tools = (Tool.of("root", "", {"type": "object", "properties": {"root": {"const": "root"}}, "required": ["root"]},
                     "tools[0]"),)
    spec = tool_grammar(ToolUse(tools, "named", "root"))
    assert accepts(xgrammar.Grammar.from_ebnf(spec.text), call_block("root", '{"root": "root"}'))


def test_a_schema_the_grammar_engine_cannot_convert_is_a_400_naming_tools():
    from specdec.serving.serving_errors import InvalidRequestError

    tools = (Tool.of("f", "", {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "tools[0]"),)
    with pytest.raises(InvalidRequestError) as error:
        tool_grammar(ToolUse(tools, "required"))
    assert error.value.param == "tools"
