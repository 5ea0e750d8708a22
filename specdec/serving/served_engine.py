"""What a frontend serves: a running AsyncEngine, the tokenizer around it, the server's
defaults and limits, and what to close when it stops.

`specdec.wiring.engine_builder.build_served_engine` assembles one for every backend (in-process
models, gRPC clients of worker actors); the protocols never build engines themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.proposers import proposer_registry as registry
from specdec.serving.async_engine import AsyncEngine


@dataclass(frozen=True)
class ServerDefaults:
    """What the server fills in for fields a request leaves unset.

    max_new_tokens: budget when the request sends 0 / nothing.
    gamma: the server's γ (0 when its configured proposer is "none"); informational; the
        engine resolves each request's γ per round from its mode (and the load policy).
    proposers: proposer names requests may pick ("draft", "ngram").
    max_prompt_chars: the longest text prompt tokenised at all (see prompt_char_limit).
    """

    max_new_tokens: int
    gamma: int
    proposers: tuple[str, ...] = registry.REQUESTABLE
    max_prompt_chars: int = 1 << 20


def prompt_char_limit(max_seq_len: int, tokenizer: Any) -> int:
    """Characters beyond which a prompt cannot fit `max_seq_len` tokens.

    No token covers more text characters than its vocabulary string has characters (byte-level
    BPE spells each byte as one character, SentencePiece each character as one), so a text
    of n characters needs at least n / longest tokens. A factor of 2 leaves room for
    normalisers that merge characters."""
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return 2 * max_seq_len * max(1, longest)


@dataclass
class ServedEngine:
    """A running engine loop and what a frontend needs around it.

    model: the name clients use for it (the target's name, e.g. "bundled:target").
    tokenizer: the target's tokenizer (its chat template, when it has one).
    closers: called (in order) by close() after the loop stopped, e.g. gRPC channels.
    monitor: the LoadMonitor deciding γ, when there is one (for the status).
    """

    loop: AsyncEngine
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    defaults: ServerDefaults
    closers: list[Callable[[], None]] = field(default_factory=list)
    monitor: Any = None
    model: str = "specdec"
    tokenizer: Any = None

    def close(self) -> None:
        self.loop.shutdown()
        for close in self.closers:
            close()
