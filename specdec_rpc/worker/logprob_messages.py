"""Token logprobs (`specdec.sampling.token_logprobs.TokenLogprob`) to and from `specdec.v1.TokenLogprob`
messages: the public API's responses and the target worker's verify outcomes use the same one."""

from __future__ import annotations

from collections.abc import Iterable

from specdec.sampling.token_logprobs import TokenLogprob
from specdec_rpc.v1 import specdec_pb2


def to_logprobs(tokens: list[TokenLogprob] | None) -> list[specdec_pb2.TokenLogprob]:
    """The tokens' logprobs as messages (none when the request did not ask for them)."""
    return [specdec_pb2.TokenLogprob(token_id=t.token_id, logprob=t.logprob, top_token_ids=[i for i, _ in t.top],
                                     top_logprobs=[v for _, v in t.top]) for t in tokens or ()]


def from_logprobs(messages: Iterable[specdec_pb2.TokenLogprob]) -> list[TokenLogprob]:
    """The core's token logprobs of messages."""
    return [TokenLogprob(m.token_id, m.logprob, tuple(zip(m.top_token_ids, m.top_logprobs))) for m in messages]
