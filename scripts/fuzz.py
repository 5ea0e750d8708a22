"""A bounded fuzz campaign of bad requests against a running `specdec serve`.

Every request it sends is invalid in one way: random bytes as the message, invalid UTF-8
in a string field, NaN / inf / out-of-range floats, token ids outside the vocabulary,
prompts over the context, megabyte prompts, thousands of stop strings, out-of-range
integers and enums, both or neither of prompt and prompt_token_ids. Every one must be
answered INVALID_ARGUMENT (or RESOURCE_EXHAUSTED where a limit is the point), quickly;
never INTERNAL, UNKNOWN or a hang. Afterwards a normal greedy request must still give the
reference output (the caller checks that).

    python scripts/fuzz.py --address 127.0.0.1:50051 --count 1000

prints a table: case -> sent, answered per status code; exits 1 if any answer was not
INVALID_ARGUMENT.
"""

from __future__ import annotations

import argparse
import collections
import math
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specdec_rpc.client import open_channel  # noqa: E402
from specdec_rpc.v1 import specdec_pb2  # noqa: E402

GENERATE = "/specdec.v1.SpeculativeDecoding/Generate"
GENERATE_STREAM = "/specdec.v1.SpeculativeDecoding/GenerateStream"
EXPECTED = {"INVALID_ARGUMENT"}
INT32_MAX, UINT32_MAX = 2**31 - 1, 2**32 - 1


def _message(**fields) -> bytes:
    fields.setdefault("max_new_tokens", 4)
    return specdec_pb2.GenerateRequest(**fields).SerializeToString()


def _string_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) carrying raw bytes: lets a string be invalid UTF-8."""
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
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
            return _message(prompt="x", speculation=specdec_pb2.SpeculationParams(gamma=self.rng.choice([-1, 65, INT32_MAX])))
        if choice == 2:
            return _message(prompt="x", stop_token_ids=[self.rng.choice([self.vocab, UINT32_MAX])])
        if choice == 3:
            return _message(prompt="x", sampling=specdec_pb2.SamplingParams(top_k=self.rng.choice([-1, -(2**31)])))
        return _message(prompt="x", stop_token_ids=list(range(5000)))

    def bad_enum(self) -> bytes:
        mode, proposer = self.rng.choice([(99, 0), (0, 99), (-1, 0), (INT32_MAX, INT32_MAX)])
        return _message(prompt="x", speculation=specdec_pb2.SpeculationParams(mode=mode, proposer=proposer))

    def prompt_both_or_neither(self) -> bytes:
        if self.rng.random() < 0.5:
            return _message()
        return _message(prompt="x", prompt_token_ids=[1, 2])

    def all(self) -> dict[str, Callable[[], bytes]]:
        return {name: getattr(self, name) for name in (
            "random_bytes", "invalid_utf8", "bad_float", "token_out_of_vocabulary", "over_the_context",
            "megabyte_prompt", "many_stop_strings", "bad_integer", "bad_enum", "prompt_both_or_neither")}


def requests(count: int, seed: int, vocab_size: int, max_seq_len: int) -> Iterator[tuple[str, bytes]]:
    """`count` (case name, wire bytes) pairs, the cases in turn."""
    cases = Cases(random.Random(seed), vocab_size, max_seq_len).all()
    names = list(cases)
    for i in range(count):
        name = names[i % len(names)]
        yield name, cases[name]()


def run_campaign(address: str, count: int, seed: int = 0, vocab_size: int = 4096, max_seq_len: int = 1024,
                 timeout_s: float = 30.0, token: str | None = None,
                 tls_ca_file: str | None = None) -> dict[str, collections.Counter]:
    """Send the requests (unary and streaming in turn); per case, a Counter of status names."""
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with open_channel(address, tls_ca_file) as channel:
        unary, stream = channel.unary_unary(GENERATE), channel.unary_stream(GENERATE_STREAM)
        for i, (name, raw) in enumerate(requests(count, seed, vocab_size, max_seq_len)):
            try:
                if i % 2:
                    for _ in stream(raw, timeout=timeout_s, metadata=metadata):
                        pass
                else:
                    unary(raw, timeout=timeout_s, metadata=metadata)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            outcomes[name][code] += 1
    return outcomes


def table(outcomes: dict[str, collections.Counter]) -> str:
    codes = sorted({code for counter in outcomes.values() for code in counter})
    lines = ["| case | sent | " + " | ".join(codes) + " |", "|---|---:|" + "---:|" * len(codes)]
    for name, counter in outcomes.items():
        lines.append(f"| {name} | {sum(counter.values())} | " + " | ".join(str(counter[c]) for c in codes) + " |")
    return "\n".join(lines)


def unexpected(outcomes: dict[str, collections.Counter]) -> dict[str, dict[str, int]]:
    return {name: {c: n for c, n in counter.items() if c not in EXPECTED}
            for name, counter in outcomes.items() if set(counter) - EXPECTED}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default="127.0.0.1:50051", help="the public gRPC port")
    parser.add_argument("--count", type=int, default=1000, help="requests to send")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=4096, help="the target's vocabulary (bundled pair: 4096)")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="the server's cache.max_seq_len")
    parser.add_argument("--token", default=None, help="bearer token (when the server requires one)")
    parser.add_argument("--tls-ca", default=None, help="CA certificate of a TLS server")
    args = parser.parse_args()
    outcomes = run_campaign(args.address, args.count, args.seed, args.vocab_size, args.max_seq_len,
                            token=args.token, tls_ca_file=args.tls_ca)
    print(table(outcomes))
    bad = unexpected(outcomes)
    if bad:
        print(f"\nanswers other than {sorted(EXPECTED)}: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
