"""Translation between the public `specdec.v1` messages and the core's requests and results.

Inbound: a GenerateRequest becomes a GenerationRequest (tokenised prompt, server defaults
filled in; speculation mode, γ and proposer carried over for the engine to resolve). Every
bad input raises ValueError whose message names the field; the router turns it into
INVALID_ARGUMENT. Checks that need the model (token ids in range, prompt + budget within the context, the max_new_tokens limit)
run when the engine admits the request (`GenerationRequest.check_limits`).

A text prompt longer than `ServerDefaults.max_prompt_chars` is refused from its length
alone: it could not fit the context, and tokenising it would cost every other request.

Outbound: RoundOutputs become GenerateChunks (the engine already cut each round's text at
stop strings and held back what may still change) and a GenerationResult becomes a
GenerateResponse / the last chunk's stats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec.round_output import GenerationResult, RoundOutput
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


@dataclass(frozen=True)
class ServerDefaults:
    """What the server fills in for fields a request leaves unset.

    max_new_tokens: budget when the request sends 0.
    gamma: the server's γ (0 when its configured proposer is "none"); informational; the
        engine resolves each request's γ per round from its mode (and the load policy).
    proposers: proposer names requests may pick ("draft", "ngram").
    max_prompt_chars: the longest text prompt tokenised at all (see prompt_char_limit).
    """

    max_new_tokens: int
    gamma: int
    proposers: tuple[str, ...] = ("draft", "ngram")
    max_prompt_chars: int = 1 << 20


def prompt_char_limit(max_seq_len: int, tokenizer: Any) -> int:
    """Characters beyond which a prompt cannot fit `max_seq_len` tokens.

    No token covers more text characters than its vocabulary string has characters (byte-level
    BPE spells each byte as one character, SentencePiece each character as one), so a text
    of n characters needs at least n / longest tokens. A factor of 2 leaves room for
    normalisers that merge characters."""
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return 2 * max_seq_len * max(1, longest)


def to_generation_request(
    message: specdec_pb2.GenerateRequest, encode: Callable[[str], list[int]], defaults: ServerDefaults
) -> GenerationRequest:
    """(Runs the tokenizer: call it off the event loop.)"""
    """The core request for a public GenerateRequest; ValueError naming the field when bad.

    The speculation mode travels as is ("auto" / "on" / "off"), with the request's γ (None
    when it sends 0 = let the server decide): the engine resolves γ each round, AUTO from
    the server's load policy (SpeculativeEngine's `policy`)."""
    prompt_ids = _prompt_ids(message, encode, defaults.max_prompt_chars)
    if message.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 1 (0 = the server's default), got {message.max_new_tokens}")
    max_new_tokens = message.max_new_tokens or defaults.max_new_tokens
    mode, gamma, proposer = _speculation(message.speculation, defaults)
    return GenerationRequest(
        prompt_token_ids=prompt_ids,
        max_new_tokens=max_new_tokens,
        sampling=_sampling(message.sampling),
        stop=tuple(message.stop),
        stop_token_ids=tuple(message.stop_token_ids),
        gamma=gamma,
        proposer=proposer,
        mode=mode,
    )


def _prompt_ids(message: specdec_pb2.GenerateRequest, encode: Callable[[str], list[int]], max_chars: int) -> list[int]:
    if message.prompt and message.prompt_token_ids:
        raise ValueError("prompt: set exactly one of prompt and prompt_token_ids, not both")
    if message.prompt_token_ids:
        return list(message.prompt_token_ids)
    if not message.prompt:
        raise ValueError("prompt: must not be empty (set prompt or prompt_token_ids)")
    if len(message.prompt) > max_chars:
        raise ValueError(
            f"prompt: {len(message.prompt)} characters cannot fit the context (at most {max_chars} characters "
            "are even tokenised)"
        )
    ids = encode(message.prompt)
    if not ids:
        raise ValueError("prompt: encodes to no tokens")
    return ids


def _sampling(message: specdec_pb2.SamplingParams) -> SamplingParams:
    seed = message.seed if message.HasField("seed") else None
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
    request was still speculating when it finished (false when its proposer was down)."""
    return specdec_pb2.GenerationStats(
        rounds=stats.rounds,
        drafted=stats.drafted,
        accepted=stats.accepted,
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_length=stats.mean_accepted_length,
        gamma=stats.gamma,
        speculation_enabled=stats.gamma > 0 and not stats.speculation_unavailable,
    )


def to_response(result: GenerationResult) -> specdec_pb2.GenerateResponse:
    return specdec_pb2.GenerateResponse(
        text=result.text,
        token_ids=result.token_ids,
        finish_reason=result.finish_reason,
        stats=to_stats(result.stats),
    )


def to_chunk(output: RoundOutput, result: GenerationResult | None = None) -> specdec_pb2.GenerateChunk:
    """One round's chunk; with the request's result, the last chunk (finish_reason, stats)."""
    chunk = specdec_pb2.GenerateChunk(text=output.text, token_ids=output.new_token_ids)
    if result is not None:
        chunk.finish_reason = result.finish_reason
        chunk.stats.CopyFrom(to_stats(result.stats))
    return chunk
