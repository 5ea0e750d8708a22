"""A bounded fuzz campaign of bad requests against a running `specdec serve` (gRPC, and
the OpenAI HTTP API with --http-url: `fuzz_http.py`).

Every gRPC request it sends is invalid in one way: random bytes as the message (to every
method of both services, health included), invalid UTF-8 or an encoded lone surrogate in a
string field, NaN / inf / out-of-range floats, token ids outside the vocabulary, prompts
over the context, megabyte prompts, thousands of stop strings, out-of-range integers,
enum numbers outside the proto's values (also past 32 bits, which protobuf would truncate
into valid ones), a known field with another wire type, messages nested past the decoder's
depth, both or neither of prompt and prompt_token_ids. Every one must be answered
INVALID_ARGUMENT, quickly; never INTERNAL, UNKNOWN or a hang. The one valid case,
extreme_float (float32's extremes: 1e-45, 3.4e38, a top_p of 1e-45), must be served (OK).
Before and after the campaign a normal greedy request must give the same output.

    python scripts/fuzz.py --address 127.0.0.1:50051 --count 1000 [--http-url http://127.0.0.1:8000 --http-count 1000]

prints a table per API: case -> sent, answered per status; exits 1 if any answer was not
the case's expected one, a call hung (past --timeout-s), or the reference output changed.
"""

from __future__ import annotations

import argparse
import collections
import math
import random
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specdec_rpc.public.client import SpecdecClient, open_channel  # noqa: E402
from specdec_rpc.v1 import specdec_pb2  # noqa: E402

GENERATE = "/specdec.v1.SpeculativeDecoding/Generate"
GENERATE_STREAM = "/specdec.v1.SpeculativeDecoding/GenerateStream"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
#: every method a corrupt message is sent to (the streaming ones: STREAMING)
SERVICES = (GENERATE, GENERATE_STREAM, "/specdec.v1.SpeculativeDecoding/GetStats", "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/List", HEALTH_WATCH)
STREAMING = {GENERATE_STREAM, HEALTH_WATCH}
EXPECTED = {"INVALID_ARGUMENT"}
#: cases that are valid requests (extreme but allowed values): they must be served
VALID_CASES = {"extreme_float": {"OK"}}
INT32_MAX, UINT32_MAX = 2**31 - 1, 2**32 - 1
HANG = "HANG"  # no answer within the campaign's timeout


def _message(**fields) -> bytes:
    fields.setdefault("max_new_tokens", 4)
    return specdec_pb2.GenerateRequest(**fields).SerializeToString()


def _string_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) carrying raw bytes: lets a string be invalid UTF-8."""
    return bytes([number << 3 | 2]) + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class Cases:
    """Generators of invalid requests (wire bytes), each named by what is wrong."""

    def __init__(self, rng: random.Random, vocab_size: int, max_seq_len: int) -> None:
        self.rng, self.vocab, self.context = rng, vocab_size, max_seq_len

    def random_bytes(self) -> bytes:
        while True:  # bytes that do not decode as a GenerateRequest
            raw = bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(1, 512)))
            try:
                specdec_pb2.GenerateRequest.FromString(raw)
            except Exception:
                return raw

    def corrupt_to_every_service(self) -> tuple[str, bytes]:
        """Bytes that decode as none of the request types, to a method of either service."""
        return self.rng.choice(SERVICES), b"\x0a\x05ab" + self.random_bytes()  # a truncated first field

    def deep_nesting(self) -> bytes:
        """Unknown groups (wire types 3 and 4) nested past the decoder's depth limit (100)."""
        depth, number = self.rng.choice([101, 200, 5000]), self.rng.choice([15, 99, 2047])
        start, end = varint(number << 3 | 3), varint(number << 3 | 4)
        return _message(prompt="x") + start * depth + end * depth

    def encoded_surrogate(self) -> bytes:
        """A lone UTF-16 surrogate as UTF-8 would spell it (ED A0 80): not valid UTF-8."""
        surrogate = self.rng.choice([b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb0\x80"])
        field = self.rng.choice([1, 6])
        return (_string_field(1, b"ab" + surrogate + b"cd") + _message() if field == 1
                else _message(prompt="x") + _string_field(6, surrogate))

    def extreme_float(self) -> bytes:
        """Valid float32 extremes: served, not refused (and not rounded to greedy or no filter)."""
        sampling = self.rng.choice([dict(temperature=1e-45), dict(temperature=3.4e38), dict(temperature=1e-30),
                                    dict(temperature=1.0, top_p=1e-45), dict(temperature=1.0, top_p=1 - 2**-24)])
        return _message(prompt="x", max_new_tokens=2, sampling=specdec_pb2.SamplingParams(seed=1, **sampling))

    def wrong_wire_type(self) -> bytes:
        """A known field sent with another wire type (a double temperature, a numeric prompt)."""
        if self.rng.random() < 0.5:
            sampling = bytes([1 << 3 | 1]) + struct.pack("<d", self.rng.choice([0.5, 1e300, 1e-300]))
            return _message(prompt="x") + _string_field(4, sampling)
        return bytes([1 << 3 | 0]) + varint(self.rng.randrange(2**32)) + _message(prompt_token_ids=[1])

    def invalid_utf8(self) -> bytes:
        bad = bytes(self.rng.choice([0x80, 0xC0, 0xFF, 0xFE, 0xED]) for _ in range(self.rng.randint(1, 16)))
        if self.rng.random() < 0.5:
            return _string_field(1, b"ok " + bad) + _message()
        return _message(prompt="ok") + _string_field(6, bad)  # a stop string

    def bad_float(self) -> bytes:
        value = self.rng.choice([math.nan, math.inf, -math.inf, -1.0, -1e-9])
        field = self.rng.choice(["temperature", "top_p"])
        if field == "top_p":
            value = self.rng.choice([value, 0.0, 1.5, 1e300])
        return _message(prompt="x", sampling=specdec_pb2.SamplingParams(**{field: value}))

    def token_out_of_vocabulary(self) -> bytes:
        bad = self.rng.choice([-1, -(2**31), self.vocab, self.vocab + self.rng.randint(0, 10**6), INT32_MAX])
        ids = [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, 8))]
        ids.insert(self.rng.randint(0, len(ids)), bad)
        return _message(prompt_token_ids=ids)

    def over_the_context(self) -> bytes:
        n = self.context + self.rng.randint(0, 4 * self.context)
        return _message(prompt_token_ids=[self.rng.randrange(self.vocab) for _ in range(n)])

    def megabyte_prompt(self) -> bytes:
        size = self.rng.randint(1, 3) * 1024 * 1024
        return _message(prompt=self.rng.choice(["a", "x ", "def f():\n"]) * (size // 2))

    def many_stop_strings(self) -> bytes:
        n = self.rng.randint(1000, 5000)
        return _message(prompt="x", stop=[f"stop{i}" for i in range(n)])

    def bad_integer(self) -> bytes:
        choice = self.rng.randrange(5)
        if choice == 0:
            return _message(prompt="x", max_new_tokens=self.rng.choice([-1, -(2**31), INT32_MAX]))
        if choice == 1:
            return _message(prompt="x",
                            speculation=specdec_pb2.SpeculationParams(gamma=self.rng.choice([-1, 65, INT32_MAX])))
        if choice == 2:
            return _message(prompt="x", stop_token_ids=[self.rng.choice([self.vocab, UINT32_MAX])])
        if choice == 3:
            return _message(prompt="x", sampling=specdec_pb2.SamplingParams(top_k=self.rng.choice([-1, -(2**31)])))
        return _message(prompt="x", stop_token_ids=list(range(5000)))

    def bad_enum(self) -> bytes:
        mode, proposer = self.rng.choice([(99, 0), (0, 99), (-1, 0), (3, 0), (0, 3), (INT32_MAX, INT32_MAX),
                                          (-(2**31), 0), (2**32 + 1, 0), (0, 2**32 + 2), (2**64 - 2**32 + 1, 0)])
        inner = b""
        for number, value in ((1, mode), (3, proposer)):
            if value:  # raw varints: protobuf would truncate those past 32 bits into valid ones
                inner += bytes([number << 3]) + varint(value % 2**64)
        return _message(prompt="x") + _string_field(5, inner)

    def prompt_both_or_neither(self) -> bytes:
        if self.rng.random() < 0.5:
            return _message()
        return _message(prompt="x", prompt_token_ids=[1, 2])

    def all(self) -> dict[str, Callable[[], bytes | tuple[str, bytes]]]:
        return {name: getattr(self, name) for name in (
            "random_bytes", "corrupt_to_every_service", "invalid_utf8", "encoded_surrogate", "bad_float",
            "extreme_float", "token_out_of_vocabulary", "over_the_context", "megabyte_prompt", "many_stop_strings",
            "bad_integer", "bad_enum", "wrong_wire_type", "deep_nesting", "prompt_both_or_neither")}


def requests(count: int, seed: int, vocab_size: int, max_seq_len: int) -> Iterator[tuple[str, str | None, bytes]]:
    """`count` (case name, method or None for Generate / GenerateStream, wire bytes), the cases in turn."""
    cases = Cases(random.Random(seed), vocab_size, max_seq_len).all()
    names = list(cases)
    for i in range(count):
        name = names[i % len(names)]
        made = cases[name]()
        yield (name, *made) if isinstance(made, tuple) else (name, None, made)


def run_campaign(address: str, count: int, seed: int = 0, vocab_size: int = 4096, max_seq_len: int = 1024,
                 timeout_s: float = 30.0, token: str | None = None,
                 tls_ca_file: str | None = None) -> dict[str, collections.Counter]:
    """Send the requests (Generate and GenerateStream in turn, or the case's method); per
    case (and method: "corrupt_to_every_service Health/Watch"), a Counter of status names
    (HANG: no answer within timeout_s)."""
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with open_channel(address, tls_ca_file) as channel:
        for i, (name, method, raw) in enumerate(requests(count, seed, vocab_size, max_seq_len)):
            try:
                if method in STREAMING or (method is None and i % 2):
                    for _ in channel.unary_stream(method or GENERATE_STREAM)(raw, timeout=timeout_s, metadata=metadata):
                        pass
                else:
                    channel.unary_unary(method or GENERATE)(raw, timeout=timeout_s, metadata=metadata)
                code = "OK"
            except grpc.RpcError as exc:
                code = HANG if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else exc.code().name
            outcomes[name if method is None else f"{name} {method.rsplit('.', 1)[-1]}"][code] += 1
    return outcomes


def reference_output(address: str, token: str | None = None, tls_ca_file: str | None = None) -> list[int]:
    """A normal greedy request's token ids (compared before and after a campaign)."""
    with SpecdecClient(address, timeout_s=120.0, retries=0, token=token, tls_ca_file=tls_ca_file) as client:
        return list(client.generate("def fibonacci(n):", max_new_tokens=16).token_ids)


def table(outcomes: dict[str, collections.Counter]) -> str:
    codes = sorted({code for counter in outcomes.values() for code in counter})
    lines = ["| case | sent | " + " | ".join(codes) + " |", "|---|---:|" + "---:|" * len(codes)]
    for name, counter in outcomes.items():
        lines.append(f"| {name} | {sum(counter.values())} | " + " | ".join(str(counter[c]) for c in codes) + " |")
    return "\n".join(lines)


def unexpected(outcomes: dict[str, collections.Counter], valid: dict[str, set[str]] | None = None,
               expected: set[str] = frozenset(EXPECTED)) -> dict[str, dict[str, int]]:
    """Per case, the answers it should not have had (`valid`: the valid cases' expected answers)."""
    valid = VALID_CASES if valid is None else valid
    found = {name: {c: n for c, n in counter.items() if c not in valid.get(name, expected)}
             for name, counter in outcomes.items()}
    return {name: codes for name, codes in found.items() if codes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default="127.0.0.1:50051", help="the public gRPC port")
    parser.add_argument("--count", type=int, default=1000, help="gRPC requests to send")
    parser.add_argument("--http-url", default=None, help="also fuzz the HTTP API at this base URL")
    parser.add_argument("--http-count", type=int, default=1000, help="HTTP requests to send")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=30.0, help="a call not answered by then is a hang")
    parser.add_argument("--vocab-size", type=int, default=4096, help="the target's vocabulary (bundled pair: 4096)")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="the server's cache.max_seq_len")
    parser.add_argument("--token", default=None, help="bearer token (when the server requires one)")
    parser.add_argument("--tls-ca", default=None, help="CA certificate of a TLS server")
    args = parser.parse_args()
    before = reference_output(args.address, args.token, args.tls_ca)
    bad = report("gRPC", run_campaign(args.address, args.count, args.seed, args.vocab_size, args.max_seq_len,
                                      args.timeout_s, args.token, args.tls_ca), unexpected)
    if args.http_url:
        import fuzz_http

        outcomes = fuzz_http.run_campaign(args.http_url, args.http_count, args.seed, args.vocab_size,
                                          args.timeout_s, args.token, args.tls_ca)
        bad = report("HTTP", outcomes, fuzz_http.unexpected) or bad
    after = reference_output(args.address, args.token, args.tls_ca)
    print(f"\nreference output before and after: {'the same' if after == before else 'CHANGED'} ({after})")
    return 1 if bad or after != before else 0


def report(api: str, outcomes: dict[str, collections.Counter], check: Callable) -> bool:
    """Print a campaign's table and what was unexpected; True when anything was."""
    print(f"\n{api}: {sum(sum(c.values()) for c in outcomes.values())} requests\n{table(outcomes)}")
    bad = check(outcomes)
    if bad:
        print(f"unexpected answers: {bad}")
    return bool(bad)


if __name__ == "__main__":
    sys.exit(main())
