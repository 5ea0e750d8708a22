"""Translation between the public `specdec.v1` messages and the core's requests and results.

Inbound: a GenerateRequest becomes a GenerationRequest (tokenised prompt, server defaults
filled in; speculation mode, γ and proposer carried over for the engine to resolve). Every
bad input raises ValueError whose message names the field; the router turns it into
INVALID_ARGUMENT. Checks that need the model (token ids in range, prompt + budget within the context, the max_new_tokens limit)
run when the engine admits the request (`GenerationRequest.check_limits`).

Outbound: RoundOutputs become GenerateChunks (text decoded cumulatively, each chunk sends
the new suffix) and a GenerationResult becomes a GenerateResponse / the last chunk's stats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec.engine import GenerationResult
from specdec.request import GenerationRequest
from specdec.sampling_params import SamplingParams
from specdec.stats import SpecStats
from specdec_rpc.v1 import specdec_pb2

PROPOSER_NAMES = {
    specdec_pb2.PROPOSER_KIND_UNSPECIFIED: None,
    specdec_pb2.PROPOSER_KIND_DRAFT: "draft",
    specdec_pb2.PROPOSER_KIND_NGRAM: "ngram",
}
MODE_NAMES = {
    specdec_pb2.SPECULATION_MODE_AUTO: "auto",
    specdec_pb2.SPECULATION_MODE_ON: "on",
    specdec_pb2.SPECULATION_MODE_OFF: "off",
}
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class ServerDefaults:
    """What the server fills in for fields a request leaves unset.

    max_new_tokens: budget when the request sends 0.
    gamma: the server's γ (0 when its configured proposer is "none"); informational; the
        engine resolves each request's γ per round from its mode (and the load policy).
    proposers: proposer names requests may pick ("draft", "ngram").
    """

    max_new_tokens: int
    gamma: int
    proposers: tuple[str, ...] = ("draft", "ngram")


def to_generation_request(
    message: specdec_pb2.GenerateRequest, encode: Callable[[str], list[int]], defaults: ServerDefaults
) -> GenerationRequest:
    """The core request for a public GenerateRequest; ValueError naming the field when bad.

    The speculation mode travels as is ("auto" / "on" / "off"), with the request's γ (None
    when it sends 0 = let the server decide): the engine resolves γ each round, AUTO from
    the server's load policy (SpeculativeEngine's `policy`)."""
    prompt_ids = _prompt_ids(message, encode)
    if message.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 1 (0 = the server's default), got {message.max_new_tokens}")
    max_new_tokens = message.max_new_tokens or defaults.max_new_tokens
    mode, gamma, proposer = _speculation(message.speculation, defaults)
    return GenerationRequest(
        prompt_token_ids=prompt_ids,
        max_new_tokens=max_new_tokens,
        sampling=_sampling(message.sampling),
        stop=tuple(message.stop),
        gamma=gamma,
        proposer=proposer,
        mode=mode,
    )


def _prompt_ids(message: specdec_pb2.GenerateRequest, encode: Callable[[str], list[int]]) -> list[int]:
    if message.prompt and message.prompt_token_ids:
        raise ValueError("prompt: set exactly one of prompt and prompt_token_ids, not both")
    if message.prompt_token_ids:
        return list(message.prompt_token_ids)
    if not message.prompt:
        raise ValueError("prompt: must not be empty (set prompt or prompt_token_ids)")
    ids = encode(message.prompt)
    if not ids:
        raise ValueError("prompt: encodes to no tokens")
    return ids


def _sampling(message: specdec_pb2.SamplingParams) -> SamplingParams:
    seed = message.seed if message.HasField("seed") else None
    if seed is not None and seed > MAX_SEED:
        raise ValueError(f"seed must be <= {MAX_SEED}, got {seed}")
    top_p = message.top_p if message.HasField("top_p") else 1.0
    return SamplingParams(temperature=message.temperature, top_k=message.top_k, top_p=top_p, seed=seed)


def _speculation(message: specdec_pb2.SpeculationParams, defaults: ServerDefaults) -> tuple[str, int | None, str | None]:
    """(mode, γ or None = the server's, proposer name or None = the server's)."""
    if message.gamma < 0:
        raise ValueError(f"gamma must be >= 0 (0 = the server's), got {message.gamma}")
    if message.mode not in MODE_NAMES:
        raise ValueError(f"speculation.mode: unknown mode {message.mode}")
    if message.proposer not in PROPOSER_NAMES:
        raise ValueError(f"speculation.proposer: unknown kind {message.proposer}")
    proposer = PROPOSER_NAMES[message.proposer]
    if proposer is not None and proposer not in defaults.proposers:
        raise ValueError(f"speculation.proposer: {proposer!r} is not available here (have {list(defaults.proposers)})")
    return MODE_NAMES[message.mode], message.gamma or None, proposer


# ---- outbound ---------------------------------------------------------------------------


def to_stats(stats: SpecStats) -> specdec_pb2.GenerationStats:
    """The public stats; gamma is the γ the policy gave the request's last round (before that
    round was cut to the remaining token budget), so speculation_enabled says whether the
    request was still speculating when it finished."""
    return specdec_pb2.GenerationStats(
        rounds=stats.rounds,
        drafted=stats.drafted,
        accepted=stats.accepted,
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_length=stats.mean_accepted_length,
        gamma=stats.gamma,
        speculation_enabled=stats.gamma > 0,
    )


def to_response(result: GenerationResult) -> specdec_pb2.GenerateResponse:
    return specdec_pb2.GenerateResponse(
        text=result.text,
        token_ids=result.token_ids,
        finish_reason=result.finish_reason,
        stats=to_stats(result.stats),
    )


class ChunkBuilder:
    """Turns a stream's RoundOutputs into GenerateChunks with incremental text.

    The output so far is decoded as a whole and each chunk sends the new suffix. Text is
    held back while it ends in an incomplete character (U+FFFD) or could be the start of a
    stop string, so the chunks' texts concatenate to the final (stop-cut) text.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop = tuple(stop)
        self.token_ids: list[int] = []
        self.sent = ""

    def chunk(self, new_token_ids: list[int]) -> specdec_pb2.GenerateChunk:
        """A chunk of a round that did not finish the request."""
        self.token_ids.extend(new_token_ids)
        return specdec_pb2.GenerateChunk(text=self._advance(self._stable_text()), token_ids=new_token_ids)

    def last_chunk(self, new_token_ids: list[int], result: GenerationResult) -> specdec_pb2.GenerateChunk:
        """The final chunk: the rest of the result's text, finish_reason and stats."""
        self.token_ids.extend(new_token_ids)
        return specdec_pb2.GenerateChunk(
            text=self._advance(result.text),
            token_ids=new_token_ids,
            finish_reason=result.finish_reason,
            stats=to_stats(result.stats),
        )

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):  # decoding changed earlier text: wait for the end
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new

    def _stable_text(self) -> str:
        text = self.decode(self.token_ids).rstrip("\ufffd")
        cut = min((text.find(s) for s in self.stop if s in text), default=-1)
        if cut >= 0:
            return text[:cut]
        for s in self.stop:  # hold back a suffix that may grow into a stop string
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    text = text[:-n]
                    break
        return text
