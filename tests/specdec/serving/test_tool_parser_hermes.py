"""The Hermes/Qwen `<tool_call>` parser: calls read out of the output, text around them as
content, malformed blocks kept as content, and a stream (cut anywhere) adding up to the
same answer as the whole output."""

import json
import random
from collections import defaultdict

import pytest

from specdec.serving.tool_parser_hermes import HermesToolParser, call_block, read_call


def block(name, arguments):
    return call_block(name, json.dumps(arguments))


TWO_CALLS = ("I will look.\n" + block("get_weather", {"city": "Paris", "note": "a } and a \" inside"}) + "\n"
             + block("add", {"a": 1, "b": [2, {"c": 3}]}) + "\n")


def ids():
    counter = iter(range(100))
    return lambda: f"call_{next(counter)}"


def streamed(text, cuts):
    """(content, {index: (id, name, arguments)}) of `text` fed in pieces cut at `cuts`."""
    parser, content, calls = HermesToolParser(ids()), "", defaultdict(lambda: [None, None, ""])
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    for i, piece in enumerate(pieces):
        delta = parser.feed(piece, final=i == len(pieces) - 1)
        content += delta.content
        for d in delta.calls:
            call = calls[d.index]
            if d.id is not None:
                assert call[0] is None, "a call is announced once"
                call[0], call[1] = d.id, d.name
            call[2] += d.arguments
    return content, {i: tuple(c) for i, c in calls.items()}


def test_several_calls_are_read_with_the_text_before_them_as_content():
    parsed = HermesToolParser(ids()).parse(TWO_CALLS)
    assert parsed.content == "I will look."
    assert [(c.id, c.name) for c in parsed.calls] == [("call_0", "get_weather"), ("call_1", "add")]
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris", "note": "a } and a \" inside"}
    assert json.loads(parsed.calls[1].arguments) == {"a": 1, "b": [2, {"c": 3}]}


def test_an_output_without_calls_is_all_content_exactly():
    text = "  def f(x):\n    return x < 3  \n"
    parsed = HermesToolParser().parse(text)
    assert parsed.content == text and parsed.calls == ()


def test_only_calls_means_no_content():
    parsed = HermesToolParser().parse("\n" + block("f", {}) + "\n")
    assert parsed.content is None and [c.name for c in parsed.calls] == ["f"]


@pytest.mark.parametrize("body", [
    "{not json}",
    '{"arguments": {"a": 1}}',  # no name
    '{"name": 3, "arguments": {}}',
    '{"name": "f", "arguments": [1, 2]}',  # arguments not an object
    '{"name": "f"}',  # no arguments
    '"just a string"',
])
def test_a_malformed_block_stays_content_verbatim_and_others_still_count(body):
    text = f"<tool_call>\n{body}\n</tool_call>\n" + block("g", {"x": 1})
    parsed = HermesToolParser().parse(text)
    assert parsed.content == f"<tool_call>\n{body}\n</tool_call>"
    assert [c.name for c in parsed.calls] == ["g"]


def test_arguments_as_json_text_or_named_parameters_are_read_too():
    assert read_call('{"name": "f", "arguments": "{\\"a\\": 1}"}') == ("f", '{"a": 1}')
    assert read_call('{"name": "f", "parameters": {"a": 1}}') == ("f", '{"a": 1}')


def test_a_block_left_open_at_the_end_is_read_as_the_others():
    parsed = HermesToolParser().parse('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')
    assert parsed.content is None and (parsed.calls[0].name, parsed.calls[0].arguments) == ("f", '{"a": 1}')
    cut = HermesToolParser().parse('<tool_call>\n{"name": "f", "argu')
    assert cut.content == '<tool_call>\n{"name": "f", "argu' and cut.calls == ()


def test_text_that_only_looks_like_a_tag_start_is_content():
    assert HermesToolParser().parse("if a <tool and b < c: <tool_cal").content == "if a <tool and b < c: <tool_cal"


def test_a_stream_cut_anywhere_adds_up_to_the_whole_answer():
    whole = HermesToolParser(ids()).parse(TWO_CALLS)
    expected = {i: (c.id, c.name, json.loads(c.arguments)) for i, c in enumerate(whole.calls)}
    rng = random.Random(0)
    cut_sets = [[k] for k in range(1, len(TWO_CALLS))] + [sorted(rng.sample(range(1, len(TWO_CALLS)), 12))
                                                          for _ in range(200)]
    for cuts in cut_sets + [list(range(1, len(TWO_CALLS)))]:  # ... and one character at a time
        content, calls = streamed(TWO_CALLS, cuts)
        assert content == whole.content, cuts
        assert {i: (c[0], c[1], json.loads(c[2])) for i, c in calls.items()} == expected, cuts


def test_a_stream_announces_the_call_before_its_arguments_end_and_streams_them():
    parser = HermesToolParser(ids())
    first = parser.feed('Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert first.content == "Hi"
    [head] = first.calls
    assert (head.index, head.id, head.name, head.arguments) == (0, "call_0", "get_weather", '{"city": "Pa')
    more = parser.feed('ris"}}\n</tool_call>', final=True)
    assert [(d.index, d.id, d.arguments) for d in more.calls] == [(0, None, 'ris"}')] and more.content == ""
    assert parser.called


def test_no_markup_leaks_into_streamed_content():
    for k in range(1, len(TWO_CALLS)):
        content, _ = streamed(TWO_CALLS, [k])
        assert "<" not in content and "tool_call" not in content


def test_whitespace_between_content_and_calls_is_dropped_but_kept_inside_content():
    parsed = HermesToolParser().parse("a\n\nb  \n" + block("f", {}) + "\n\n")
    assert parsed.content == "a\n\nb"
