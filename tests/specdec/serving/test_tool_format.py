"""Tools reach the prompt in the model's format: a template that knows tools renders them
itself; the bundled pair's (which does not) gets the Hermes/Qwen format, which its parser
reads back."""

import json

import pytest
from transformers import AutoTokenizer

from specdec.models.model_paths import BUNDLED_DIR
from specdec.serving.chat_template import check_messages, render_chat
from specdec.serving.tool_format import TOOLS_FOOTER, TOOLS_HEADER, parser_for, template_knows_tools
from specdec.serving.tool_parser_hermes import HermesToolParser, call_block
from specdec.serving.tool_spec import Tool, ToolUse

WEATHER = Tool.of("get_weather", "The weather now",
                  {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}}, "tools[0]")
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"unit": "celsius"}'}}
HISTORY = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]
# a tool-aware template in the manner of Qwen's (it renders `tools` and each call's arguments mapping;
# transformers' trim_blocks drops the newline after each block tag)
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }}({{ t.function.parameters | tojson }});{% endfor %}\n"
    "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments.unit }}]{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def tool_tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR / "target")
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def test_the_bundled_pair_gets_the_hermes_format(tokenizer):
    assert not template_knows_tools(tokenizer) and parser_for(tokenizer) is HermesToolParser
    prompt = render_chat(tokenizer, check_messages(HISTORY), tools=ToolUse((WEATHER,), "auto"))
    listing = TOOLS_HEADER + json.dumps(WEATHER.as_openai()) + TOOLS_FOOTER
    assert prompt == (
        "# system: " + listing.replace("\n", "\n# ") + "\n# user: weather?\n"
        + call_block("get_weather", '{"unit": "celsius"}') + "\n"
        + "# tool: <tool_response>\n# 20 degrees\n# </tool_response>\n# assistant:\n")


def test_a_system_message_comes_first_and_the_tool_list_joins_it(tokenizer):
    messages = check_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    prompt = render_chat(tokenizer, messages, tools=ToolUse((WEATHER,), "required"))
    assert prompt.startswith("# system: Be brief.\n# \n# # Tools\n") and prompt.count("# system:") == 1


def test_with_tool_choice_none_or_no_tools_nothing_is_offered(tokenizer):
    plain = [{"role": "user", "content": "hi"}]
    assert render_chat(tokenizer, plain, tools=ToolUse((WEATHER,), "none")) == render_chat(tokenizer, plain)
    assert "<tools>" not in render_chat(tokenizer, check_messages(HISTORY))  # the past calls still render
    assert "<tool_call>" in render_chat(tokenizer, check_messages(HISTORY))


def test_what_the_bundled_format_writes_for_a_call_its_parser_reads_back(tokenizer):
    prompt = render_chat(tokenizer, check_messages(HISTORY))
    written = prompt[prompt.index("<tool_call>"):prompt.index("</tool_call>") + len("</tool_call>")]
    [call] = HermesToolParser().parse(written).calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"unit": "celsius"})


def test_a_template_that_knows_tools_renders_them_itself_with_arguments_as_a_mapping(tool_tokenizer):
    assert template_knows_tools(tool_tokenizer)
    prompt = render_chat(tool_tokenizer, check_messages(HISTORY), tools=ToolUse((WEATHER,), "auto"))
    assert prompt == ('TOOLS:get_weather({"type": "object", "properties": {"unit": {"enum": ["celsius", '
                      '"fahrenheit"]}}});user: weather?assistant: [get_weather celsius]tool: 20 degreesassistant:')
    assert not render_chat(tool_tokenizer, check_messages(HISTORY), tools=ToolUse((WEATHER,), "none")).startswith(
        "TOOLS")
