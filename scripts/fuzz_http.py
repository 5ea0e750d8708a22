"""The HTTP half of the fuzz campaign (`fuzz.py --http-url`): bad bodies for the
OpenAI-compatible API.

Every body is invalid in one way: JSON nested past any valid request's depth (the whole
body, `stop`, a message's content or role), lone UTF-16 surrogates (`"ab\\ud800cd"`) in
the prompt, a message, a stop string, NaN / Infinity / out-of-range numbers, integers past
int32 / uint64, unknown enum strings and wrong types, token ids outside the vocabulary,
bodies that are not JSON (random bytes, invalid UTF-8, truncated), malformed messages,
megabyte prompts and thousands of stop strings, unsupported fields. Each must be answered
400 with `param` naming a field ("400-no-param" in the table otherwise), quickly; never a
5xx or a hang. The one valid case, extreme_float (a temperature of 1e39, 1e300 or 1e-300,
a top_p of 1e-50 or 5e-324), must be served: 200.
"""

from __future__ import annotations

import collections
import http.client
import json
import random
import ssl
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz  # noqa: E402

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
EXPECTED = {"400"}
VALID_CASES = {"extreme_float": {"200"}}
HANG = "HANG"  # no answer within the campaign's timeout
FIELDS = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "n", "stream",
          "stream_options", "speculation", "timeout_s", "model", "user")


def _nested(depth: int, inner: str = '"a"') -> str:
    return "[" * depth + inner + "]" * depth


class HttpCases:
    """Generators of invalid requests: (path, body bytes), each named by what is wrong."""

    def __init__(self, rng: random.Random, vocab_size: int) -> None:
        self.rng, self.vocab = rng, vocab_size

    def _body(self, path: str = COMPLETIONS, **fields) -> tuple[str, bytes]:
        base = {"prompt": "x"} if path == COMPLETIONS else {"messages": [{"role": "user", "content": "x"}]}
        return path, json.dumps({**base, "max_tokens": 2, **fields}).encode()

    def deep_nesting(self) -> tuple[str, bytes]:
        depth = self.rng.choice([9, 12, 50, 1000, 100_000])
        kind = self.rng.randrange(4)
        if kind == 0:
            return COMPLETIONS, _nested(depth, "").encode()
        if kind == 1:
            return COMPLETIONS, f'{{"prompt": "x", "max_tokens": 2, "stop": {_nested(depth)}}}'.encode()
        content = '{"a": ' * depth + "1" + "}" * depth
        role = _nested(depth)
        message = f'{{"role": "user", "content": {content}}}' if kind == 2 else f'{{"role": {role}, "content": "x"}}'
        return CHAT, f'{{"messages": [{message}], "max_tokens": 2}}'.encode()

    def surrogate(self) -> tuple[str, bytes]:
        lone = self.rng.choice(["\\ud800", "\\udfff", "\\udc00"])
        where = self.rng.randrange(4)
        if where == 0:
            return COMPLETIONS, f'{{"prompt": "ab{lone}cd", "max_tokens": 2}}'.encode()
        if where == 1:
            return CHAT, f'{{"messages": [{{"role": "user", "content": "ab{lone}cd"}}], "max_tokens": 2}}'.encode()
        if where == 2:
            return COMPLETIONS, f'{{"prompt": "x", "stop": ["{lone}"], "max_tokens": 2}}'.encode()
        parts = f'[{{"type": "text", "text": "{lone}"}}]'
        return CHAT, f'{{"messages": [{{"role": "user", "content": {parts}}}], "max_tokens": 2}}'.encode()

    def extreme_float(self) -> tuple[str, bytes]:
        """Valid extremes of the doubles the API takes: served as asked."""
        sampling = self.rng.choice([{"temperature": 1e39}, {"temperature": 1e300}, {"temperature": 1e-300},
                                    {"temperature": 5e-324}, {"temperature": 1.0, "top_p": 1e-50},
                                    {"temperature": 1.0, "top_p": 5e-324}, {"temperature": 0.5, "top_p": 1 - 2**-52}])
        return self._body(seed=self.rng.randrange(2**64), **sampling)

    def bad_float(self) -> tuple[str, bytes]:
        field = self.rng.choice(["temperature", "top_p", "timeout_s"])
        value = self.rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "-1", "-1e-300", '"hot"', "true", "[]"])
        if field == "top_p":
            value = self.rng.choice([value, "0", "1.0000001", "-0.0", "1e300"])
        return COMPLETIONS, f'{{"prompt": "x", "max_tokens": 2, "{field}": {value}}}'.encode()

    def bad_integer(self) -> tuple[str, bytes]:
        field, value = self.rng.choice([
            ("top_k", 2**31), ("top_k", 2**63), ("top_k", 2**70), ("top_k", -2), ("top_k", 1.5),
            ("seed", 2**64), ("seed", -(2**63) - 1), ("max_tokens", 0), ("max_tokens", 10**6), ("max_tokens", 1e308),
            ("max_tokens", -(2**63)), ("n", 0), ("n", 129), ("stop_token_ids", [2**32]), ("stop_token_ids", [-1]),
            ("stop_token_ids", [1.5]), ("timeout_s", 0), ("timeout_s", -5),
        ])
        return self._body(**{field: value})

    def huge_integer(self) -> tuple[str, bytes]:
        digits = "9" * self.rng.choice([20, 400, 5000])
        field = self.rng.choice(["max_tokens", "top_k", "seed"])
        return COMPLETIONS, f'{{"prompt": "x", "{field}": {digits}}}'.encode()

    def bad_speculation(self) -> tuple[str, bytes]:
        value = self.rng.choice([{"mode": "sometimes"}, {"mode": 5}, {"mode": ["on"]}, {"proposer": 5},
                                 {"proposer": "oracle"}, {"proposer": {}}, {"gamma": 2**31}, {"gamma": 1e300},
                                 {"gamma": -1}, {"gamma": 1000}, {"colour": "blue"}, "on", [1]])
        return self._body(speculation=value)

    def wrong_type(self) -> tuple[str, bytes]:
        field = self.rng.choice(FIELDS)
        value = self.rng.choice([{"a": 1}, [{"b": [1, {}]}], True, -3.5, "text", [None]])
        if field in ("prompt", "stop") and isinstance(value, str):
            value = {"a": value}
        if field == "user" or (field == "stream" and value is True):
            field, value = "mystery", value  # user takes anything; an unknown field is refused
        return self._body(**{field: value})

    def not_json(self) -> tuple[str, bytes]:
        return COMPLETIONS, self.rng.choice([
            bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(1, 256))), b"\xff\xfe{}", b'{"prompt": "x"',
            b"", b"null", b"[]", b"1", b'"x"', b'{"prompt": "\xc0\x80"}', b'{"prompt": "x",}'])

    def token_out_of_vocabulary(self) -> tuple[str, bytes]:
        bad = self.rng.choice([-1, self.vocab, self.vocab + 10**6, 2**31, 2**63])
        if self.rng.random() < 0.5:
            return self._body(prompt=[1, 2, bad])
        return self._body(stop_token_ids=[bad])

    def bad_messages(self) -> tuple[str, bytes]:
        messages = self.rng.choice([[], {}, "hi", [{"role": "user"}], [{"role": "robot", "content": "x"}],
                                    [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
                                    [{"role": "user", "content": 5}], [{"role": "user", "content": "x"}] * 2000, [7]])
        return CHAT, json.dumps({"messages": messages, "max_tokens": 2}).encode()

    def huge(self) -> tuple[str, bytes]:
        kind = self.rng.randrange(3)
        if kind == 0:
            return self._body(prompt="x " * (self.rng.randint(1, 2) * 1024 * 1024 // 2))
        if kind == 1:
            return self._body(stop=[f"s{i}" for i in range(self.rng.randint(1000, 5000))])
        return self._body(stop=["y" * 1000])

    def unsupported_field(self) -> tuple[str, bytes]:
        field, value = self.rng.choice([("mystery", 1), ("presence_penalty", 5.0), ("best_of", 3), ("echo", [True]),
                                        ("logit_bias", {"5": 500}), ("tools", [{}])])
        return self._body(**{field: value})

    def all(self) -> dict[str, Callable[[], tuple[str, bytes]]]:
        return {name: getattr(self, name) for name in (
            "deep_nesting", "surrogate", "extreme_float", "bad_float", "bad_integer", "huge_integer",
            "bad_speculation", "wrong_type", "not_json", "token_out_of_vocabulary", "bad_messages", "huge",
            "unsupported_field")}


def requests(count: int, seed: int, vocab_size: int) -> Iterator[tuple[str, str, bytes]]:
    """`count` (case name, path, body), the cases in turn."""
    cases = HttpCases(random.Random(seed), vocab_size).all()
    names = list(cases)
    for i in range(count):
        name = names[i % len(names)]
        yield name, *cases[name]()


def run_campaign(base_url: str, count: int, seed: int = 0, vocab_size: int = 4096, timeout_s: float = 30.0,
                 token: str | None = None, tls_ca_file: str | None = None) -> dict[str, collections.Counter]:
    """POST the bodies; per case, a Counter of answers: the status ("400-no-param" for a
    400 that names no field), HANG (no answer within timeout_s) or the connection error."""
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    url = urlparse(base_url)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    for name, path, body in requests(count, seed, vocab_size):
        if url.scheme == "https":
            context = ssl.create_default_context(cafile=tls_ca_file)
            conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=timeout_s, context=context)
        else:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)
        try:
            conn.request("POST", (url.path or "").rstrip("/") + path, body, headers)
            response = conn.getresponse()
            outcomes[name][_answer(response.status, response.read())] += 1
        except TimeoutError:
            outcomes[name][HANG] += 1
        except OSError as exc:
            outcomes[name][type(exc).__name__] += 1
        finally:
            conn.close()
    return outcomes


def _answer(status: int, body: bytes) -> str:
    if status != 400:
        return str(status)
    try:
        param = json.loads(body)["error"]["param"]
    except (ValueError, KeyError, TypeError):
        param = None
    return "400" if param else "400-no-param"


def unexpected(outcomes: dict[str, collections.Counter]) -> dict[str, dict[str, int]]:
    """Per case, the answers it should not have had."""
    return fuzz.unexpected(outcomes, valid=VALID_CASES, expected=EXPECTED)
