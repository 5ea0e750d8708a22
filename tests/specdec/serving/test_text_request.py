"""A client's TextRequest becomes the engine's request only when every string in it is
valid Unicode: a lone UTF-16 surrogate (which JSON escapes can carry) is refused naming
its field, before any tokenizer sees it."""

import pytest

from specdec.serving.served_engine import ServerDefaults
from specdec.serving.serving_errors import InvalidRequestError
from specdec.serving.text_request import TextRequest, to_generation_request
from specdec.serving.tool_parser_hermes import END
from specdec.serving.tool_spec import Tool, ToolUse

DEFAULTS = ServerDefaults(max_new_tokens=8, gamma=4)


class ChatTokenizer:
    chat_template = "joined"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(m["content"] for m in messages)


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))  # raises on a lone surrogate, as real tokenizers fail on one


@pytest.mark.parametrize("request_, param", [
    (TextRequest(prompt="ab\ud800cd"), "prompt"),
    (TextRequest(prompt="x", stop=("ok", "\udfff")), "stop[1]"),
    (TextRequest(messages=({"role": "user", "content": "fine"}, {"role": "user", "content": "ab\ud800"})),
     "messages[1].content"),
])
def test_a_lone_surrogate_is_refused_naming_its_field(request_, param):
    with pytest.raises(InvalidRequestError) as error:
        to_generation_request(request_, encode, DEFAULTS, ChatTokenizer())
    assert error.value.param == param and "surrogate" in str(error.value)


def test_valid_unicode_everywhere_passes():
    request = TextRequest(messages=({"role": "user", "content": "h\u00e9llo \U0001f600"},), stop=("\u00e9",))
    generation = to_generation_request(request, encode, DEFAULTS, ChatTokenizer())
    assert bytes(generation.prompt_token_ids).decode("utf-8") == "h\u00e9llo \U0001f600"


@pytest.mark.parametrize("choice, parallel, call_end", [
    ("auto", False, True),  # one call at most: the output ends where its first call does
    ("auto", True, False),
    ("required", False, False),  # forced: the grammar takes one block and ends there itself
    ("none", False, False),  # no calls are read at all
])
def test_parallel_tool_calls_false_ends_an_unforced_output_at_its_first_call(choice, parallel, call_end):
    tools = ToolUse((Tool.of("f", "", None, "tools[0]"),), choice, parallel=parallel)
    if choice == "required":
        pytest.importorskip("xgrammar")
    request = TextRequest(messages=({"role": "user", "content": "hi"},), tools=tools, stop=("bye",))
    generation = to_generation_request(request, encode, DEFAULTS, ChatTokenizer())
    assert generation.stop == ("bye",)  # the client's: the caps bound them
    assert generation.server_stop == ((END,) if call_end else ())
