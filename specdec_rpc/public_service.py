"""The public SpeculativeDecoding service's behaviour, independent of how it is hosted.

`PublicService` turns GenerateRequests into engine requests, runs them on a RouterBackend
and turns the outcome into GenerateResponse / GenerateChunks. Failures are raised as
exceptions; the host (the Ray Serve router, or a plain grpc.aio servicer) maps them to
status codes with `specdec_rpc.status_codes.status_for`. Health follows readiness: SERVING
once the backend (draft and target) is loaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpc_health.v1 import health_pb2

from specdec.request import GenerationRequest
from specdec.round_output import RoundOutput
from specdec_rpc.public_api import to_chunk, to_generation_request, to_response
from specdec_rpc.router_backend import RouterBackend
from specdec_rpc.status_codes import NotReadyError
from specdec_rpc.v1 import specdec_pb2

SERVICE_NAME = specdec_pb2.DESCRIPTOR.services_by_name["SpeculativeDecoding"].full_name


class PublicService:
    """Generate / GenerateStream / health on a backend that may still be loading."""

    def __init__(self, backend: RouterBackend | None = None) -> None:
        self.backend = backend
        self.load_error: BaseException | None = None

    def _ready(self) -> RouterBackend:
        if self.backend is None:
            reason = f"failed to load: {self.load_error}" if self.load_error else "models are still loading"
            raise NotReadyError(f"the server is not ready ({reason})")
        return self.backend

    async def _translate(self, backend: RouterBackend, message: specdec_pb2.GenerateRequest) -> GenerationRequest:
        """The core request; tokenising runs on a worker thread, never on the event loop."""
        return await asyncio.to_thread(to_generation_request, message, backend.encode, backend.defaults)

    async def generate(self, message: specdec_pb2.GenerateRequest) -> specdec_pb2.GenerateResponse:
        """Run one request to completion (cancellation aborts it and frees its slots)."""
        backend = self._ready()
        request = await self._translate(backend, message)
        async with backend.loop.submit(request) as stream:
            result = await stream.result()
        return to_response(result)

    async def generate_stream(self, message: specdec_pb2.GenerateRequest) -> AsyncIterator[specdec_pb2.GenerateChunk]:
        """One chunk per round that confirmed tokens; the last one carries finish_reason and stats."""
        backend = self._ready()
        request = await self._translate(backend, message)
        async with backend.loop.submit(request) as stream:
            last = RoundOutput(stream.seq_id, [], None)
            async for output in stream:
                if output.finish_reason is None:
                    yield to_chunk(output)
                else:
                    last = output
            result = await stream.result()
        yield to_chunk(last, result)

    def stats(self) -> specdec_pb2.GetStatsResponse:
        """The live speculation picture: the load monitor's decision and measurements (when
        there is one) and this replica's totals."""
        backend = self._ready()
        engine = backend.loop.engine
        totals = engine.stats
        response = specdec_pb2.GetStatsResponse(
            rounds=totals.rounds, drafted=totals.drafted, accepted=totals.accepted,
            mean_accepted_length=totals.mean_accepted_length, requests_running=engine.num_running,
            speculation_enabled=engine.gamma > 0, gamma=engine.gamma, reason="static γ (no load monitor)",
            acceptance_rate=totals.acceptance_rate, window_mean_accepted_length=totals.mean_accepted_length,
            measurements_source="local", circuit_breaker="closed",
        )
        response.round_profile.rounds = engine.profile.rounds
        for name, value in engine.profile.means_ms().items():
            setattr(response.round_profile, name, value)
        if engine.draft_ahead is not None:
            response.round_profile.rows_drafted_ahead = engine.draft_ahead.rows_ahead
            response.round_profile.look_ahead_hit_rate = engine.draft_ahead.hit_rate
        if backend.monitor is not None:
            status = backend.monitor.status()
            response.speculation_enabled, response.gamma = status["speculation_enabled"], status["gamma"]
            response.reason, response.acceptance_rate = status["reason"], status["alpha"] or 0.0
            response.window_mean_accepted_length = status["mean_accepted_length"] or 0.0
            response.acceptance_per_position.extend(status["alpha_per_position"])
            _set_policy_view(response, status)
            response.qps, response.in_flight, response.queued = status["qps"], status["in_flight"], status["queued"]
            response.measurements_source, response.circuit_breaker = status["source"], status["breaker"]
        unavailable = engine.proposer.unavailable_reason
        if unavailable is not None:
            response.speculation_enabled, response.reason = False, f"speculation unavailable: {unavailable}"
        return response

    def health(self, service: str = "") -> int:
        """HealthCheckResponse.ServingStatus for `service` ("" = the whole server)."""
        if service not in ("", SERVICE_NAME):
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        ready = self.backend is not None and self.backend.loop.is_running
        return health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING


def _set_policy_view(response: Any, status: dict) -> None:
    """The goodput policy's cost model and crossover into a GetStatsResponse."""
    cost, crossover = status["round_cost"], status["crossover"]
    if cost is not None:
        names = ("verify_fixed_ms", "verify_token_ms", "draft_fixed_ms", "draft_step_ms", "draft_row_step_ms")
        for name, seconds in zip(names, (*cost.verify, *cost.draft)):
            setattr(response.round_cost, name, 1000.0 * seconds)
        response.round_cost.overhead_ms = 1000.0 * cost.overhead_s
    response.crossover_rows = crossover.rows or 0
    response.crossover_qps = crossover.qps or 0.0
    response.off_because_of_load = status["off_because_of_load"]
