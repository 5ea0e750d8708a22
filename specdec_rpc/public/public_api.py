"""Translation between the public `specdec.v1` messages and the core frontend's requests and results.

Inbound: a GenerateRequest becomes a `TextRequest` (0 = the server's default for
max_new_tokens and γ; the enums become the core's `SpeculationMode` and proposer names); the
frontend fills in defaults and tokenises, and the core's rules validate it
(`specdec.serving.text_request`, `specdec.requests.request`). Every bad input raises
ValueError whose message names the field; the router turns it into INVALID_ARGUMENT.

Outbound: the frontend's Deltas become GenerateChunks and a Completion (or the engine's
GenerationResult) becomes a GenerateResponse / the last chunk's stats.
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.proposers import proposer_registry as registry
from specdec.serving.frontend import Completion, Delta
from specdec.requests.request import GenerationRequest
from specdec.round.round_output import GenerationResult, RoundOutput
from specdec.sampling.sampling_params import SamplingParams
from specdec.serving.served_engine import ServerDefaults, prompt_char_limit
from specdec.requests.speculation_mode import SpeculationMode
from specdec.requests.stats import SpecStats
from specdec.serving.text_request import TextRequest
from specdec.serving.text_request import to_generation_request as _core_request
from specdec_rpc.worker.logprob_messages import to_logprobs
from specdec.requests.grammar_spec import GrammarSpec
from specdec_rpc.v1 import specdec_pb2

__all__ = ["MODE_NAMES", "PROPOSER_NAMES", "ServerDefaults", "prompt_char_limit", "to_chunk",
           "to_generation_request", "to_response", "to_stats", "to_text_request"]

PROPOSER_NAMES = {
    specdec_pb2.PROPOSER_KIND_UNSPECIFIED: None,
    specdec_pb2.PROPOSER_KIND_DRAFT: registry.DRAFT,
    specdec_pb2.PROPOSER_KIND_NGRAM: registry.NGRAM,
}
MODE_NAMES = {
    specdec_pb2.SPECULATION_MODE_AUTO: SpeculationMode.AUTO,
    specdec_pb2.SPECULATION_MODE_ON: SpeculationMode.ON,
    specdec_pb2.SPECULATION_MODE_OFF: SpeculationMode.OFF,
}


def to_text_request(message: specdec_pb2.GenerateRequest) -> TextRequest:
    """The frontend's request for a GenerateRequest; ValueError naming the field for what
    only the message can tell (an unknown enum value, a bad sampling parameter)."""
    speculation = message.speculation
    if speculation.mode not in MODE_NAMES:
        raise ValueError(f"speculation.mode: unknown mode {speculation.mode}")
    if speculation.proposer not in PROPOSER_NAMES:
        raise ValueError(f"speculation.proposer: unknown kind {speculation.proposer}")
    return TextRequest(
        prompt=message.prompt,
        prompt_token_ids=tuple(message.prompt_token_ids),
        max_new_tokens=_budget(message),
        sampling=_sampling(message.sampling),
        stop=tuple(message.stop),
        stop_token_ids=tuple(message.stop_token_ids),
        mode=MODE_NAMES[speculation.mode],
        gamma=speculation.gamma or None,
        proposer=PROPOSER_NAMES[speculation.proposer],
        tpot_target_ms=speculation.tpot_target_ms if speculation.HasField("tpot_target_ms") else None,
        logprobs=message.logprobs if message.HasField("logprobs") else None,
        grammar=GrammarSpec(message.grammar.kind, message.grammar.text) if message.HasField("grammar") else None,
        prompt_logprobs=message.prompt_logprobs if message.HasField("prompt_logprobs") else None,
    )


def to_generation_request(
    message: specdec_pb2.GenerateRequest, encode: Callable[[str], list[int]], defaults: ServerDefaults
) -> GenerationRequest:
    """The engine's request for a GenerateRequest (runs the tokenizer: call it off the event loop)."""
    return _core_request(to_text_request(message), encode, defaults)


def _budget(message: specdec_pb2.GenerateRequest) -> int | None:
    """The frontend's max_new_tokens: 0 scores the prompt only (score_only), None is the server's."""
    if not message.score_only:
        return message.max_new_tokens or None
    if not message.HasField("prompt_logprobs"):
        raise ValueError("score_only: needs prompt_logprobs (the scores it returns)")
    if message.max_new_tokens:
        raise ValueError(f"score_only: generates nothing, but max_new_tokens is {message.max_new_tokens}")
    return 0


def _sampling(message: specdec_pb2.SamplingParams) -> SamplingParams:
    seed = message.seed if message.HasField("seed") else None
    top_p = message.top_p if message.HasField("top_p") else 1.0
    repetition = message.repetition_penalty if message.HasField("repetition_penalty") else 1.0
    return SamplingParams(temperature=message.temperature, top_k=message.top_k, top_p=top_p, seed=seed,
                          min_p=message.min_p, presence_penalty=message.presence_penalty,
                          frequency_penalty=message.frequency_penalty, repetition_penalty=repetition,
                          logit_bias=dict(message.logit_bias))


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
        cached_tokens=stats.cached_tokens,
    )


def to_response(result: GenerationResult | Completion) -> specdec_pb2.GenerateResponse:
    return specdec_pb2.GenerateResponse(
        text=result.text,
        token_ids=result.token_ids,
        finish_reason=result.finish_reason,
        stats=to_stats(result.stats),
        logprobs=to_logprobs(result.logprobs),
        prompt_logprobs=to_logprobs((result.prompt_logprobs or [None])[1:]),
    )


def to_chunk(output: RoundOutput | Delta, result: GenerationResult | None = None) -> specdec_pb2.GenerateChunk:
    """One round's chunk; the last one (a Delta with a finish reason, or a RoundOutput with
    the request's result) carries finish_reason and stats."""
    ids = output.token_ids if isinstance(output, Delta) else output.new_token_ids
    chunk = specdec_pb2.GenerateChunk(text=output.text, token_ids=ids, logprobs=to_logprobs(output.logprobs),
                                      prompt_logprobs=to_logprobs((output.prompt_logprobs or [None])[1:]))
    stats = result.stats if result is not None else getattr(output, "stats", None)
    if stats is not None:
        chunk.finish_reason = result.finish_reason if result is not None else output.finish_reason
        chunk.stats.CopyFrom(to_stats(stats))
    return chunk
