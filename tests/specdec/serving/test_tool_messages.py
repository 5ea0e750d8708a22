"""A conversation may carry past tool calls (assistant `tool_calls`) and their results (tool
messages with `tool_call_id`); malformed ones are refused naming the field."""

import pytest

from specdec.serving.chat_template import check_messages
from specdec.serving.serving_errors import InvalidRequestError

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def test_calls_and_results_are_kept_and_a_calling_message_may_have_no_content():
    assistant, tool = check_messages([{"role": "assistant", "content": None, "tool_calls": [CALL]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "2"}])
    assert assistant == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert tool == {"role": "tool", "content": "2", "tool_call_id": "call_1"}


def test_plain_messages_are_unchanged():
    assert check_messages([{"role": "user", "content": "hi", "name": "me"}]) == ({"role": "user", "content": "hi"},)


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "content": None, "tool_calls": "f()"}, "messages[0].tool_calls"),
    ({"role": "assistant", "tool_calls": [{"type": "function"}]}, "messages[0].tool_calls[0]"),
    ({"role": "assistant", "tool_calls": [{**CALL, "type": "code"}]}, "messages[0].tool_calls[0]"),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "", "arguments": "{}"}}]},
     "messages[0].tool_calls[0].function.name"),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{a: 1"}}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"role": "assistant", "tool_calls": [{**CALL, "id": 7}]}, "messages[0].tool_calls[0].id"),
    ({"role": "tool", "tool_call_id": 7, "content": "x"}, "messages[0].tool_call_id"),
    ({"role": "user", "content": None}, "messages[0].content"),
])
def test_malformed_tool_parts_name_their_field(message, param):
    with pytest.raises(InvalidRequestError) as error:
        check_messages([message])
    assert error.value.param == param
