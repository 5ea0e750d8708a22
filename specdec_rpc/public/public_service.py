"""The public SpeculativeDecoding service over gRPC messages: a thin shim on the core frontend.

`PublicService` turns GenerateRequests into the frontend's TextRequests, runs them on the
`specdec.serving.frontend.Frontend` (validation, admission, deltas, usage, status) and turns the
outcome into GenerateResponse / GenerateChunks / GetStatsResponse. Failures are the core's
exceptions; the host (the Ray Serve router, or a plain grpc.aio servicer) maps them to
status codes with `specdec_rpc.public.status_codes.status_for`. Health follows readiness: SERVING
once the backend (draft and target) is loaded (`Frontend.is_ready`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpc_health.v1 import health_pb2

from specdec.serving.frontend import Frontend
from specdec.serving.served_engine import ServedEngine
from specdec.policy.policy_status import PolicyStatus
from specdec.serving.server_status import ServerStatus
from specdec_rpc.public.public_api import to_chunk, to_response, to_text_request
from specdec_rpc.v1 import specdec_pb2

SERVICE_NAME = specdec_pb2.DESCRIPTOR.services_by_name["SpeculativeDecoding"].full_name


class PublicService:
    """Generate / GenerateStream / GetStats / health on a backend that may still be loading."""

    def __init__(self, backend: ServedEngine | None = None, frontend: Frontend | None = None) -> None:
        self.frontend = frontend or Frontend(backend)

    @property
    def backend(self) -> ServedEngine | None:
        return self.frontend.served

    @backend.setter
    def backend(self, served: ServedEngine | None) -> None:
        self.frontend.served = served

    @property
    def load_error(self) -> BaseException | None:
        return self.frontend.load_error

    @load_error.setter
    def load_error(self, exc: BaseException | None) -> None:
        self.frontend.load_error = exc

    async def generate(self, message: specdec_pb2.GenerateRequest) -> specdec_pb2.GenerateResponse:
        """Run one request to completion (cancellation aborts it and frees its slots)."""
        self.frontend.ready()
        return to_response(await self.frontend.generate(to_text_request(message)))

    async def generate_stream(self, message: specdec_pb2.GenerateRequest) -> AsyncIterator[specdec_pb2.GenerateChunk]:
        """One chunk per round that confirmed tokens; the last one carries finish_reason and stats."""
        self.frontend.ready()
        deltas = self.frontend.stream(to_text_request(message))
        try:
            async for delta in deltas:
                yield to_chunk(delta)
        finally:
            await deltas.aclose()

    def stats(self) -> specdec_pb2.GetStatsResponse:
        """The live speculation picture: the load monitor's decision and measurements (when
        there is one) and this replica's totals."""
        return to_stats_response(self.frontend.status())

    def health_statuses(self) -> dict[str, int]:
        """grpc.health.v1 List: the status of every service name this server answers for."""
        return {service: self.health(service) for service in ("", SERVICE_NAME)}

    def health(self, service: str = "") -> int:
        """HealthCheckResponse.ServingStatus for `service` ("" = the whole server)."""
        if service not in ("", SERVICE_NAME):
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        ready = self.frontend.is_ready
        return health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING


def to_stats_response(status: ServerStatus) -> specdec_pb2.GetStatsResponse:
    """The typed server status as a GetStatsResponse."""
    policy = status.policy
    response = specdec_pb2.GetStatsResponse(
        rounds=status.rounds, drafted=status.drafted, accepted=status.accepted,
        mean_accepted_length=status.mean_accepted_length, requests_running=status.requests_running,
        speculation_enabled=policy.speculation_enabled, gamma=policy.gamma, reason=policy.reason,
        acceptance_rate=policy.alpha if policy.alpha is not None else status.acceptance_rate,
        window_mean_accepted_length=(policy.mean_accepted_length if policy.mean_accepted_length is not None
                                     else status.mean_accepted_length),
        acceptance_per_position=policy.alpha_per_position,
        qps=policy.qps, in_flight=policy.in_flight, queued=policy.queued,
        measurements_source=policy.source, circuit_breaker=policy.breaker,
    )
    response.round_profile.rounds = status.rounds_profiled
    for name, value in status.round_profile_ms.items():
        setattr(response.round_profile, name, value)
    if status.draft_ahead is not None:
        response.round_profile.rows_drafted_ahead, response.round_profile.look_ahead_hit_rate = status.draft_ahead
    if status.overlap_choice is not None:
        profile = response.round_profile
        profile.look_ahead_tokens_per_s, profile.sequential_tokens_per_s, profile.looking_ahead = status.overlap_choice
    _set_policy_view(response, policy)
    if status.speculation_unavailable is not None:
        response.speculation_enabled = False
        response.reason = f"speculation unavailable: {status.speculation_unavailable}"
    return response


def _set_policy_view(response: Any, policy: PolicyStatus) -> None:
    """The goodput policy's cost model and crossover into a GetStatsResponse."""
    cost, crossover = policy.round_cost, policy.crossover
    if cost is not None:
        names = ("verify_fixed_ms", "verify_row_ms", "verify_drafted_token_ms", "verify_prompt_token_ms",
                 "verify_speculating_ms", "verify_prompt_round_ms",
                 "draft_fixed_ms", "draft_step_ms", "draft_row_step_ms", "draft_catch_up_token_ms")
        for name, seconds in zip(names, (*cost.verify, *cost.draft)):
            setattr(response.round_cost, name, 1000.0 * seconds)
        response.round_cost.overhead_ms = 1000.0 * cost.overhead_s
        response.round_cost.prompt_tokens = cost.prompt_tokens
        response.round_cost.drafting_scale = cost.drafting_scale
        response.round_cost.plain_scale = cost.plain_scale
    response.crossover_rows = crossover.rows or 0
    response.crossover_qps = crossover.qps or 0.0
    response.off_because_of_load = policy.off_because_of_load
