"""Every refused field gets a 400 naming it; nothing returns a 5xx (HTTP, on in-process models).

Table-driven over every field of both generation routes, read from their protocol models
(a field added later is covered without editing this table): a value of a JSON type the field
does not take, and the out-of-range values of each field, are 400 with `param` naming the field
(or the member of it at fault: `speculation.gamma`, `messages[0].role`) and the message saying
which; only the fields OpenAI has that change nothing here (`SamplingRequest.IGNORED`) take
any value. Then random bodies for both routes and /tokenize, /detokenize (hypothesis, a fixed
seed): each is answered 200, 400 naming a field it sent, 404 for another model, or 504 past a
`timeout_s` it sent; never a 5xx, never an error inside a stream.
"""

from __future__ import annotations

import http.client
import json
import os
from urllib.parse import urlparse

import pytest

from specdec_http.protocol.requests import ChatCompletionRequest, CompletionRequest
from specdec_http.tokenize_routes import DETOKENIZE_FIELDS, TOKENIZE_FIELDS

MODEL = "bundled:target"
COMPLETIONS, CHAT, TOKENIZE, DETOKENIZE = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
KINDS = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest}
BASE = {COMPLETIONS: {"model": MODEL, "prompt": "def f():", "max_tokens": 2},
        CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        TOKENIZE: {"model": MODEL, "prompt": "def f():"}, DETOKENIZE: {"model": MODEL, "tokens": [5]}}
#: a value of each JSON type, wrong for a field that does not take that type; a list of objects
#: and an object of lists are wrong for every field
SAMPLES = {"string": "bad", "number": 2.5, "boolean": True}
WRONG_FOR_ALL = ([{"bad": 1}], {"bad": [1]})


def exchange(base_url: str, path: str, body: dict) -> tuple[int, str]:
    """(status, body text) of a POST; a stream is read to its end."""
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120.0)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def json_types(kind: type, name: str) -> set[str]:
    """The JSON types a request field takes (its schema's, null aside; an integer is a number)."""
    prop = kind.model_json_schema()["properties"][name]
    types: set[str] = set()
    for option in prop.get("anyOf", [prop]):
        declared = option.get("type", "object")  # a $ref is a nested model: an object
        types.update([declared] if isinstance(declared, str) else declared)
    return types - {"null"}


def wrong_values(kind: type, name: str) -> list:
    types = json_types(kind, name)
    wrong = [value for json_type, value in SAMPLES.items() if json_type not in types]
    return wrong + list(WRONG_FOR_ALL)


def names_the_field(answer: dict, name: str) -> bool:
    param, message = answer["error"]["param"] or "", answer["error"]["message"]
    return (param == name or param.startswith((f"{name}.", f"{name}["))) and name in message


WRONG_TYPES = [(path, name, value) for path, kind in KINDS.items()
               for name in kind.model_fields if name not in kind.IGNORED for value in wrong_values(kind, name)]


@pytest.mark.parametrize("path, name, value", WRONG_TYPES, ids=[f"{p[4:]}-{n}-{type(v).__name__}" for p, n, v in
                                                                WRONG_TYPES])
def test_a_value_of_a_type_the_field_does_not_take_is_400_naming_it(server, path, name, value):
    status, text = exchange(server.url, path, {**BASE[path], name: value})
    assert status == 400 and names_the_field(json.loads(text), name), text


SHARED_RANGES = [
    ("max_tokens", [0, -1, 10**9]), ("temperature", [-0.5, -1e300]), ("top_p", [0, -1, 1.5]),
    ("top_k", [-2, 2**31]), ("seed", [2**64, -(2**63) - 1]), ("presence_penalty", [2.5, -2.5]),
    ("frequency_penalty", [2.01, -3]), ("repetition_penalty", [0, -1.0]), ("min_p", [-0.1, 1.5]),
    ("logit_bias", [{"1": 101}, {"1": -100.5}, {"99999999": 1}, {"-1": 1}]), ("stop_token_ids", [[-1], [10**9]]),
    ("stop", [["x"] * 10_000]), ("n", [0, -1]), ("best_of", [0]), ("timeout_s", [0, -1]),
    ("speculation", [{"gamma": -1}, {"gamma": 10**6}, {"mode": "sometimes"}, {"proposer": "oracle"},
                     {"tpot_target_ms": 0}]),
    ("stream_options", [{"include_usage": True}]),  # without stream: true
]
OUT_OF_RANGE = [(path, name, value) for path in KINDS for name, values in SHARED_RANGES for value in values] + [
    (COMPLETIONS, name, value) for name, values in [("prompt", ["", [], [-1], [10**9], "x" * 100_000]),
                                                    ("logprobs", [-1, 21])] for value in values] + [
    (CHAT, name, value) for name, values in [
        ("messages", [[], [{"role": "wizard", "content": "x"}], [{"role": "user"}],
                      [{"role": "user", "content": "x " * 3000}]]),  # longer than the context
        ("max_completion_tokens", [0, 10**9]), ("top_logprobs", [-1, 21])] for value in values]


@pytest.mark.parametrize("path, name, value", OUT_OF_RANGE, ids=[f"{p[4:]}-{n}-{i}" for i, (p, n, _) in
                                                                 enumerate(OUT_OF_RANGE)])
def test_a_value_out_of_the_fields_range_is_400_naming_it(server, path, name, value):
    status, text = exchange(server.url, path, {**BASE[path], name: value})
    assert status == 400 and names_the_field(json.loads(text), name), text


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

#: fields the fuzz leaves to BASE (a random budget would make a valid body slow, not wrong)
BUDGET = ("max_tokens", "max_completion_tokens")
INTS = st.integers(-3, 70_000) | st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30])
TEXT = st.text(max_size=12)
SCALARS = st.none() | st.booleans() | INTS | st.integers(-(2**70), 2**70) | TEXT | st.sampled_from(["bad", MODEL]) \
    | st.floats(allow_nan=False, allow_infinity=False)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=6)
PART = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["text", "image_url"]) | JSON, "text": TEXT | JSON})
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | JSON,
    "content": TEXT | st.lists(PART, max_size=3) | JSON, "name": TEXT | JSON})
#: values near the valid ones (the right shape, any content), besides any JSON at all
NEAR = {
    "speculation": st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["on", "off", "auto"]) | JSON, "gamma": INTS | JSON,
        "proposer": st.sampled_from(["draft", "ngram"]) | JSON, "tpot_target_ms": st.floats() | JSON}),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | JSON,
                                                          "continuous_usage_stats": st.booleans() | JSON}),
    "messages": st.lists(MESSAGE, max_size=3),
    "prompt": TEXT | st.lists(INTS, max_size=4) | st.lists(TEXT, max_size=3) | st.lists(st.lists(INTS, max_size=3),
                                                                                      max_size=2),
    "logit_bias": st.dictionaries(st.sampled_from(["0", "1", "-1", "99999999", " 5", "５", "²"]) | TEXT,
                                  st.floats(allow_nan=False) | INTS | JSON, max_size=3),
    "stop": TEXT | st.lists(TEXT, max_size=5), "stop_token_ids": st.lists(INTS, max_size=4),
    **{name: INTS | st.booleans() for name in ("logprobs", "top_logprobs", "seed", "n", "best_of", "top_k")},
    **{name: st.floats(allow_nan=False, allow_infinity=False) for name in (
        "temperature", "top_p", "min_p", "timeout_s", "presence_penalty", "frequency_penalty", "repetition_penalty")},
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema"]) | JSON}),
}


NEAR["tokens"] = st.lists(INTS, max_size=4)
#: the fields of each route the fuzz sets; /tokenize and /detokenize too (their own small bodies)
FUZZED = {**{path: [name for name in kind.model_fields if name not in BUDGET] for path, kind in KINDS.items()},
          TOKENIZE: sorted(TOKENIZE_FIELDS), DETOKENIZE: sorted(DETOKENIZE_FIELDS)}


@st.composite
def bodies(draw) -> tuple[str, dict]:
    """A route and a body: its base with up to four of the route's fields (or an unknown one) set at random."""
    path = draw(st.sampled_from(sorted(FUZZED)))
    names = FUZZED[path] + ["mystery"]
    body = dict(BASE[path])
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True)):
        body[name] = draw(NEAR[name] | JSON if name in NEAR else JSON)
    return path, body


@settings(max_examples=int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "150")), deadline=None, derandomize=True,
          database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=bodies())
def test_random_bodies_are_served_or_refused_naming_a_field_they_sent_never_a_5xx(server, case):
    path, body = case
    status, text = exchange(server.url, path, body)
    if status == 200:
        assert "internal_error" not in text and "service_unavailable_error" not in text, text
        return
    answer = json.loads(text)
    allowed = {400, 404} | ({504} if body.get("timeout_s") is not None else set())
    assert status in allowed, (status, body, text)
    if status == 400:
        assert any(names_the_field(answer, name) for name in body), (body, text)
