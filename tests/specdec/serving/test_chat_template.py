"""Chat messages become a prompt through the tokenizer's own template; a model without one,
or a malformed message, is bad input naming the field."""

from types import SimpleNamespace

import pytest

from specdec.serving.chat_template import check_messages, render_chat
from specdec.serving.serving_errors import InvalidRequestError


def test_the_bundled_pair_ships_a_template_that_ends_where_the_reply_begins(tokenizer):
    prompt = render_chat(tokenizer, [{"role": "system", "content": "Be brief.\nPython only."},
                                     {"role": "user", "content": "add two numbers"}])
    assert prompt == "# system: Be brief.\n# Python only.\n# user: add two numbers\n# assistant:\n"


def test_a_model_without_a_template_is_refused_naming_messages():
    with pytest.raises(InvalidRequestError, match="has no chat template") as error:
        render_chat(SimpleNamespace(chat_template=None), [{"role": "user", "content": "hi"}], model="plain-model")
    assert error.value.param == "messages" and "plain-model" in str(error.value)


def test_text_parts_are_joined_with_newlines_as_vllm_does():
    [message] = check_messages(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert message == {"role": "user", "content": "a\nb"}


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ("hello", "messages"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "x"}, {"role": "user", "content": 3}], "messages[1].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages[0].content"),
    (["just text"], "messages[0]"),
])
def test_malformed_messages_name_the_offending_field(messages, param):
    with pytest.raises(InvalidRequestError) as error:
        check_messages(messages)
    assert error.value.param == param
