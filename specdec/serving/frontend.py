"""The protocol-free frontend: what every public API does with a request.

`Frontend` checks readiness, validates and tokenises a `TextRequest` off the event loop,
admits it to the engine loop (the admission limit), enforces its deadline, and hands out
`Delta`s (each round's new text and token ids; the engine already cut the text at stop
strings and held back what may still change) and a `Completion` with the usage counts,
the finish reason and the speculation statistics. Failures are the core's exceptions
(`specdec.serving.serving_errors`); the gRPC and HTTP shims only translate messages and map
those exceptions to their status codes. Health and the typed server status live here
too, so both protocols report the same thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from specdec.requests.request import GenerationRequest
from specdec.serving.request_log import CANCELLED, DEADLINE, FinishedRequest, RequestLog
from specdec.round.round_output import FINISH_ERROR, GenerationResult
from specdec.round.overlap_choice import LOOK_AHEAD, SEQUENTIAL
from specdec.serving.served_engine import ServedEngine
from specdec.policy.policy_status import static_policy
from specdec.serving.server_status import ServerStatus
from specdec.serving.serving_errors import DeadlineExceededError, NotReadyError
from specdec.requests.stats import SpecStats
from specdec.serving.text_request import TextRequest, to_generation_request
from specdec.sampling.token_logprobs import TokenLogprob


@dataclass(frozen=True)
class Usage:
    """Token counts of one request (OpenAI's `usage`)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens the target's prefix cache held (prompt_tokens_details)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Delta:
    """One round's new output and the usage so far; the last one of a stream carries the
    finish reason, the statistics and the request's usage (its text and ids may be empty).
    logprobs: one per token of token_ids when the request asked for them
    (specdec.sampling.token_logprobs), else None; prompt_logprobs: on the first Delta, one
    per prompt token (None first) when asked for."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stats: SpecStats | None = None
    usage: Usage | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_token_ids: list[int] | None = None  # with prompt_logprobs: the prompt they score


@dataclass(frozen=True)
class Completion:
    """A finished request: the generated text and ids, why it ended, its statistics (and
    one logprob per generated token when the request asked for them)."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
    usage: Usage
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_token_ids: list[int] | None = None  # with prompt_logprobs: the prompt they score


class Frontend:
    """Serves TextRequests on a served engine that may still be loading."""

    def __init__(self, served: ServedEngine | None = None) -> None:
        self.served = served
        self.load_error: BaseException | None = None
        self.closing: str | None = None  # why new requests are refused (a drain: specdec.serving.drain)
        self.requests = RequestLog()  # every request that ended, until the metrics collect them

    # ---- readiness ---------------------------------------------------------------------

    def ready(self) -> ServedEngine:
        """The served engine; NotReadyError while it loads (or when loading failed) or drains."""
        if self.closing is not None:
            raise NotReadyError(f"the server is not ready ({self.closing})")
        if self.served is None:
            reason = f"failed to load: {self.load_error}" if self.load_error else "models are still loading"
            raise NotReadyError(f"the server is not ready ({reason})")
        return self.served

    @property
    def is_ready(self) -> bool:
        """Loaded, the engine loop running and the target answering (what health checks
        report as SERVING; a draft that is down only degrades speculation)."""
        served = self.served
        if self.closing is not None or served is None or not served.loop.is_running:
            return False
        return served.loop.engine.verifier.unavailable_reason is None

    def problems(self) -> list[str]:
        """Why the server is not (fully) serving, for health reports ([] = all well). The one
        place health asks the engine about itself."""
        if self.closing is not None:
            return [self.closing]
        if self.served is None:
            return [f"failed to load: {self.load_error}" if self.load_error else "models are still loading"]
        found = [] if self.served.loop.is_running else ["the engine loop is not running"]
        target = self.served.loop.engine.verifier.unavailable_reason
        if target is not None:
            found.append(target)
        unavailable = self.served.loop.engine.proposer.unavailable_reason
        if unavailable is not None:
            found.append(f"speculation unavailable: {unavailable}")
        return found

    @property
    def model(self) -> str:
        return self.served.model if self.served is not None else "specdec"

    @property
    def proposers(self) -> tuple[str, ...]:
        """The proposer names a request may pick here (none while loading)."""
        return self.served.defaults.proposers if self.served is not None else ()

    @property
    def max_model_len(self) -> int | None:
        """The target's context in tokens (cache.max_seq_len); None while loading."""
        return self.served.loop.engine.verifier.max_seq_len if self.served is not None else None

    # ---- requests ----------------------------------------------------------------------

    async def prepare(self, request: TextRequest) -> GenerationRequest:
        """The engine's request; tokenising (and a chat template) run on a worker thread."""
        served = self.ready()
        return await asyncio.to_thread(
            to_generation_request, request, served.encode, served.defaults, served.tokenizer, served.model
        )

    async def generate(self, request: TextRequest) -> Completion:
        """Run one request to completion (cancellation or its deadline abort it and free its slots)."""
        outcome = _Outcome(time.monotonic(), streaming=False)
        with self._recorded(outcome):
            served = self.ready()
            core = await self.prepare(request)
            outcome.prompt_tokens = len(core.prompt_token_ids)
            deadline = _deadline(request)

            async def run() -> GenerationResult:
                async with served.loop.submit(core, seq_id=request.request_id) as stream:
                    return await stream.result()

            try:
                result = await asyncio.wait_for(run(), _remaining(deadline))
            except asyncio.TimeoutError as exc:  # builtin TimeoutError since 3.11
                raise _deadline_error(request) from exc
            outcome.finished(result)
            return _completion(_scored(result) if request.scores_only else result, core.prompt_token_ids)

    async def stream(self, request: TextRequest) -> AsyncIterator[Delta]:
        """One Delta per round that confirmed tokens, then a last one with the finish reason,
        statistics and usage. Closing the iterator early aborts the request (slots freed)."""
        outcome = _Outcome(time.monotonic(), streaming=True)
        with self._recorded(outcome):
            served = self.ready()
            core = await self.prepare(request)
            outcome.prompt_tokens = len(core.prompt_token_ids)
            deadline = _deadline(request)
            async with served.loop.submit(core, seq_id=request.request_id) as stream:
                last = Delta("", [])
                while True:
                    try:
                        output = await asyncio.wait_for(stream.__anext__(), _remaining(deadline))
                    except StopAsyncIteration:
                        break
                    except asyncio.TimeoutError as exc:  # builtin TimeoutError since 3.11
                        raise _deadline_error(request) from exc
                    output = _scored(output) if request.scores_only else output
                    outcome.generation_tokens += len(output.new_token_ids)
                    so_far = Usage(outcome.prompt_tokens, outcome.generation_tokens)
                    scored = None if output.prompt_logprobs is None else list(core.prompt_token_ids)
                    delta = Delta(output.text, list(output.new_token_ids), usage=so_far, logprobs=output.logprobs,
                                  prompt_logprobs=output.prompt_logprobs, prompt_token_ids=scored)
                    if output.finish_reason is None:
                        yield delta
                    else:
                        last = delta
                result = await stream.result()
            result = _scored(result) if request.scores_only else result
            outcome.finished(result)
            usage = Usage(len(core.prompt_token_ids), len(result.token_ids), result.stats.cached_tokens)
            yield Delta(last.text, last.token_ids, result.finish_reason, result.stats, usage, last.logprobs,
                        last.prompt_logprobs, last.prompt_token_ids)

    @contextlib.contextmanager
    def _recorded(self, outcome: "_Outcome") -> Iterator[None]:
        """Add the request to `requests` however it ends (for the metrics)."""
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            outcome.finish_reason = outcome.finish_reason or CANCELLED
            raise
        except DeadlineExceededError:
            outcome.finish_reason = DEADLINE
            raise
        except BaseException:
            outcome.finish_reason = outcome.finish_reason or FINISH_ERROR
            raise
        finally:
            self.requests.add(outcome.record())

    # ---- status ------------------------------------------------------------------------

    def status(self) -> ServerStatus:
        """This replica's totals and the policy's view (the load monitor's, when there is one)."""
        served = self.ready()
        engine = served.loop.engine
        totals, profile = engine.stats, engine.profile
        ahead = engine.draft_ahead
        return ServerStatus(
            ready=self.is_ready, problems=tuple(self.problems()),
            rounds=totals.rounds, drafted=totals.drafted, accepted=totals.accepted,
            acceptance_rate=totals.acceptance_rate, mean_accepted_length=totals.mean_accepted_length,
            requests_running=engine.num_running, requests_waiting=engine.num_waiting,
            policy=served.monitor.status() if served.monitor is not None else static_policy(engine.gamma),
            round_profile_ms=dict(profile.means_ms()), rounds_profiled=profile.rounds,
            draft_ahead=(ahead.rows_ahead, ahead.hit_rate) if ahead is not None else None,
            overlap_choice=_overlap_choice(ahead),
            speculation_unavailable=engine.proposer.unavailable_reason,
        )


def _overlap_choice(ahead) -> tuple[float, float, bool] | None:
    """ServerStatus.overlap_choice of the engine's measured choice for a lone request (None
    without one: not drafting ahead, or no lone request yet)."""
    choice = None if ahead is None else ahead.lone_choice
    if choice is None:
        return None
    return choice.rates.get(LOOK_AHEAD) or 0.0, choice.rates.get(SEQUENTIAL) or 0.0, choice.looks_ahead


@dataclass
class _Outcome:
    """How a request is going, for its FinishedRequest record."""

    started: float  # time.monotonic() at arrival
    streaming: bool
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finish_reason: str | None = None
    queue_s: float = 0.0
    cached_tokens: int = 0

    def finished(self, result: GenerationResult) -> None:
        self.generation_tokens, self.finish_reason = len(result.token_ids), result.finish_reason
        self.queue_s, self.cached_tokens = result.queue_s, result.stats.cached_tokens

    def record(self) -> FinishedRequest:
        return FinishedRequest(self.prompt_tokens, self.generation_tokens, self.finish_reason or FINISH_ERROR,
                               time.monotonic() - self.started, self.queue_s, self.streaming, self.cached_tokens)


def _completion(result: GenerationResult, prompt: tuple[int, ...]) -> Completion:
    usage = Usage(len(prompt), len(result.token_ids), result.stats.cached_tokens)
    scored = list(prompt) if result.prompt_logprobs is not None else None
    return Completion(result.seq_id, result.text, list(result.token_ids), result.finish_reason, result.stats, usage,
                      result.logprobs, result.prompt_logprobs, scored)


def _scored(output):
    """A RoundOutput or GenerationResult of a request that only scores its prompt, without
    the one token it was run for (finish reason "length": its budget of 0 is spent)."""
    kept = {"text": "", "logprobs": [] if output.logprobs is not None else None}
    if isinstance(output, GenerationResult):
        return dataclasses.replace(output, token_ids=[], finish_reason="length", **kept)
    return dataclasses.replace(output, new_token_ids=[], **kept,
                               finish_reason=None if output.finish_reason is None else "length")


def _deadline(request: TextRequest) -> float | None:
    return None if request.timeout_s is None else time.monotonic() + request.timeout_s


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _deadline_error(request: TextRequest) -> DeadlineExceededError:
    return DeadlineExceededError(f"deadline exceeded: the request did not finish within {request.timeout_s}s")
