"""The public SpeculativeDecoding service's behaviour, independent of how it is hosted.

`PublicService` turns GenerateRequests into engine requests, runs them on a RouterBackend
and turns the outcome into GenerateResponse / GenerateChunks. Failures are raised as
exceptions; the host (the Ray Serve router, or a plain grpc.aio servicer) maps them to
status codes with `specdec_rpc.status_codes.status_for`. Health follows readiness: SERVING
once the backend (draft and target) is loaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from grpc_health.v1 import health_pb2

from specdec.request import GenerationRequest
from specdec_rpc.public_api import ChunkBuilder, to_generation_request, to_response
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

    def _translate(self, backend: RouterBackend, message: specdec_pb2.GenerateRequest) -> GenerationRequest:
        return to_generation_request(message, backend.encode, backend.defaults)

    async def generate(self, message: specdec_pb2.GenerateRequest) -> specdec_pb2.GenerateResponse:
        """Run one request to completion (cancellation aborts it and frees its slots)."""
        backend = self._ready()
        request = self._translate(backend, message)
        async with backend.loop.submit(request) as stream:
            result = await stream.result()
        return to_response(result)

    async def generate_stream(self, message: specdec_pb2.GenerateRequest) -> AsyncIterator[specdec_pb2.GenerateChunk]:
        """One chunk per round that confirmed tokens; the last one carries finish_reason and stats."""
        backend = self._ready()
        request = self._translate(backend, message)
        builder = ChunkBuilder(backend.decode, request.stop)
        async with backend.loop.submit(request) as stream:
            last: list[int] = []
            async for output in stream:
                if output.finish_reason is None:
                    yield builder.chunk(output.new_token_ids)
                else:
                    last = output.new_token_ids
            result = await stream.result()
        yield builder.last_chunk(last, result)

    def health(self, service: str = "") -> int:
        """HealthCheckResponse.ServingStatus for `service` ("" = the whole server)."""
        if service not in ("", SERVICE_NAME):
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        ready = self.backend is not None and self.backend.loop.is_running
        return health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
