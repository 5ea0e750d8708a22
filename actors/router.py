"""SpecdecRouter: the Ray Serve deployment behind Serve's gRPC and HTTP proxies (the public ingress)
and, with `serving.ingress: direct`, behind its own gRPC and HTTP ports (Serve's direct ingress:
the same methods, called in this process without the proxy; `specdec_rpc.public.direct_port`).

Serve's gRPC proxy routes each call by its method name to the deployment method of the
same name: `Generate` and `GenerateStream` of specdec.v1.SpeculativeDecoding and `Check` of
grpc.health.v1.Health. Serve's HTTP proxy calls `__call__` with each HTTP request: the
OpenAI-compatible API (`specdec_http.http_api`). Both protocols share one frontend
(`specdec.serving.frontend.Frontend`) on one backend (gRPC clients of the draft worker and the
target group, an AsyncEngine running the rounds): one batch, one admission limit. The
router only translates: failures become status codes on Serve's `grpc_context`
(`specdec_rpc.public.status_codes`) or OpenAI error objects.

The backend comes from a factory (picklable, called inside the replica), so the same
deployment runs on remote workers (`remote_parts`) or on in-process models
(`build_served_engine` without parts). It is built on a background thread: health reports
NOT_SERVING and calls get UNAVAILABLE until it is ready.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from ray import serve

from starlette.requests import Request
from starlette.responses import Response

from prometheus_client import CollectorRegistry

from specdec_metrics.prometheus_metrics import exposition, prometheus_metric_classes, tee_metric_classes
from specdec_metrics.router_metrics import RouterMetrics, ray_metric_classes
from specdec.serving.api_auth import AuthenticationError, TokenSource
from specdec.config.config import SecurityConfig
from specdec.serving.serving_errors import RETRY_AFTER_S
from specdec.serving.drain import Drain
from specdec_rpc.public import proxy_binding
from specdec_rpc.public.raw_requests import parse
from actors.served_actor import own_cores
from specdec_http.cors import Cors
from specdec_http.http_api import HttpApi
from specdec_http.metrics_route import MetricsRoute
from specdec_rpc.public.public_service import PublicService
from specdec.serving.served_engine import ServedEngine
from specdec_rpc.public.status_codes import UnknownServiceError, error_kind, status_for
from specdec_rpc.v1 import specdec_pb2

logger = logging.getLogger(__name__)

#: the servicer registrations Serve's gRPC proxy needs (import paths, resolved in the proxy)
#: (both services take raw request bytes, so a corrupt message is INVALID_ARGUMENT here
#: rather than UNKNOWN inside the proxy: `specdec_rpc.public.raw_requests`; the first one makes the
#: handlers registered after it report a dead replica as UNAVAILABLE: `specdec_rpc.public.replica_loss`)
GRPC_SERVICER_FUNCTIONS = [
    "specdec_rpc.public.replica_loss.report_replica_loss_as_unavailable",
    "specdec_rpc.public.raw_requests.add_SpeculativeDecodingServicer_to_server",
    "specdec_rpc.public.raw_requests.add_HealthServicer_to_server",
]


#: the caller's own mistakes: answered with a status, not logged as server errors
_CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND,
                  grpc.StatusCode.UNAUTHENTICATED}

#: the trailing metadata key that tells an overloaded call's client when to try again (seconds)
RETRY_AFTER_KEY = "retry-after"


class CallFailed(Exception):
    """Raised for a failed call after its status went onto Serve's gRPC context. It carries
    only the details text: the original (e.g. a grpc.RpcError) may not survive pickling to
    the proxy, which would turn the status into INTERNAL."""


def _fail(exc: BaseException, grpc_context: Any) -> bool:
    """Put exc's status code and details on Serve's gRPC context. True when the call
    should end quietly with that status; False when CallFailed should be raised (and logged)."""
    code, details = status_for(exc)
    if grpc_context is None:
        return False
    grpc_context.set_code(code)
    grpc_context.set_details(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # overloaded: when to try again
        grpc_context.set_trailing_metadata([(RETRY_AFTER_KEY, str(RETRY_AFTER_S))])
    return code in _CLIENT_ERRORS


@serve.deployment(ray_actor_options={"num_cpus": 0})
class SpecdecRouter:
    """The public SpeculativeDecoding service and the standard health service."""

    METRICS_PERIOD_S = 1.0

    def __init__(self, backend_factory: Callable[[], ServedEngine], security: SecurityConfig | None = None,
                 model: str = "") -> None:
        own_cores(1)  # the router only tokenises and does small tensor work: the models get the cores
        proxy_binding.install()  # serving.ingress direct: this replica's own gRPC port binds as direct_port says
        security = security or SecurityConfig()
        self.tokens = TokenSource(security.api_tokens_file)  # + env SPECDEC_API_TOKENS; none = open
        self.open_health = security.open_health
        self.service = PublicService()
        registry = CollectorRegistry()  # the same metrics for /metrics on the API port
        classes = tee_metric_classes(ray_metric_classes(), prometheus_metric_classes(registry))
        self.metrics = RouterMetrics(classes, model=model)
        authorize = self.tokens.check if self.tokens.enabled else None
        self.http = HttpApi(self.service.frontend, error_kind=error_kind, observe_stream=self.metrics.observe_stream,
                            authorize=authorize, open_paths=frozenset({"/health"} if self.open_health else ()),
                            cors=Cors(security.cors_allowed_origins),
                            metrics=MetricsRoute(lambda: exposition(registry)))
        self._closed = threading.Event()
        self._drain = Drain(self.service.frontend)
        self.replica_id = uuid.uuid4().hex[:12]
        self._loader = threading.Thread(
            target=self._load, args=(backend_factory,), name="specdec-router-load", daemon=True
        )
        self._loader.start()

    def _load(self, backend_factory: Callable[[], ServedEngine]) -> None:
        try:
            self.service.backend = backend_factory()
        except BaseException as exc:  # reported by health and every call
            logger.exception("loading the router's backend failed")
            self.service.load_error = exc
            return
        self._export_metrics()

    def _export_metrics(self) -> None:
        """Poll the engine's totals and the load monitor's status into the Prometheus metrics."""
        backend = self.service.backend
        while not self._closed.wait(self.METRICS_PERIOD_S):
            try:
                status = backend.monitor.status() if backend.monitor is not None else None
                self.metrics.update(backend.loop.engine, status)
                self.metrics.observe_finished(self.service.frontend.requests.drain())
            except Exception:  # metrics must never take the router down
                logger.exception("updating metrics failed")

    async def __call__(self, request: Request) -> Response:
        """An HTTP request from Serve's HTTP proxy: the OpenAI-compatible API and /health."""
        return await self.http.handle(request)

    async def Generate(  # noqa: N802 (gRPC method name)
        self, request: specdec_pb2.GenerateRequest, grpc_context: Any = None
    ) -> specdec_pb2.GenerateResponse:
        """Unary generation; errors become status codes (INVALID_ARGUMENT names the field)."""
        try:
            self._authorize(grpc_context)
            return await self.service.generate(parse(request, specdec_pb2.GenerateRequest))
        except Exception as exc:
            if _fail(exc, grpc_context):
                return specdec_pb2.GenerateResponse()  # not sent: the status is an error
            raise CallFailed(status_for(exc)[1]) from None

    async def GenerateStream(  # noqa: N802
        self, request: specdec_pb2.GenerateRequest, grpc_context: Any = None
    ) -> AsyncIterator[specdec_pb2.GenerateChunk]:
        """Streams each round's tokens; a cancelled call aborts the request (slots freed)."""
        try:
            self._authorize(grpc_context)
            request = parse(request, specdec_pb2.GenerateRequest)
        except Exception as exc:
            _fail(exc, grpc_context)
            raise CallFailed(status_for(exc)[1]) from None
        stream = self.service.generate_stream(request)
        start = last = time.perf_counter()
        first: float | None = None
        gaps: list[tuple[float, int]] = []
        try:
            async for chunk in stream:
                now = time.perf_counter()
                if chunk.token_ids and first is None:
                    first = now - start
                elif chunk.token_ids:
                    gaps.append((now - last, len(chunk.token_ids)))
                last = now if chunk.token_ids else last
                yield chunk
            self.metrics.observe_stream(first, gaps)
        except Exception as exc:
            # a stream must raise: Serve copies the context's code only with a message
            _fail(exc, grpc_context)
            raise CallFailed(status_for(exc)[1]) from None
        finally:
            await stream.aclose()

    async def GetStats(  # noqa: N802
        self, request: specdec_pb2.GetStatsRequest, grpc_context: Any = None
    ) -> specdec_pb2.GetStatsResponse:
        """The live speculation picture of this replica (cluster-wide load via Redis)."""
        try:
            self._authorize(grpc_context)
            parse(request, specdec_pb2.GetStatsRequest)
            return self.service.stats()
        except Exception as exc:
            if _fail(exc, grpc_context):
                return specdec_pb2.GetStatsResponse()
            raise CallFailed(status_for(exc)[1]) from None

    def _authorize(self, grpc_context: Any) -> None:
        """Raise AuthenticationError unless the call's metadata carries a valid bearer token
        (no tokens configured: every call is allowed)."""
        if not self.tokens.enabled:
            return
        metadata = grpc_context.invocation_metadata() if grpc_context is not None else ()
        self.tokens.check(next((value for key, value in metadata if key == "authorization"), None))

    def check_health(self) -> None:
        """Serve's replica health check: fails while the backend failed to load, so that
        `serve status` and KubeRay show it (Serve then replaces the replica: a new load), and
        once a drain ended (SIGTERM / preStop): a drained replica refuses every request, so on
        a pod that keeps running Serve must replace it."""
        failure = self.load_failure()
        if failure is not None:
            raise RuntimeError(f"the router's backend failed to load: {failure}")
        if self._drain.finished:
            raise RuntimeError("the router was drained: it serves no request any more")

    async def drain(self, grace_s: float) -> dict[str, Any]:
        """Stop admitting, let in-flight requests finish within grace_s, end the rest as
        unavailable, stop the engine loop (specdec.serving.drain); this replica's report."""
        report = await self._drain.run(grace_s)
        return {"replica": self.replica_id, **report.as_dict()}

    def load_failure(self) -> str | None:
        """Why the backend failed to load ('Type: message'; None while it loads or serves):
        `specdec serve` asks while it waits for the start, to fail it at once naming this."""
        error = self.service.load_error
        return None if error is None else f"{type(error).__name__}: {error}"

    async def Check(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, grpc_context: Any = None
    ) -> health_pb2.HealthCheckResponse:
        """grpc.health.v1: SERVING while loaded and the target answers (a draft that is
        down only degrades speculation, which GetStats reports), NOT_SERVING otherwise."""
        request = self._health_request(request, grpc_context, health_pb2.HealthCheckRequest)
        if request is None:
            return health_pb2.HealthCheckResponse()
        status = self.service.health(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            _fail(UnknownServiceError(f"unknown service {request.service!r}"), grpc_context)
        return health_pb2.HealthCheckResponse(status=status)

    async def List(  # noqa: N802
        self, request: health_pb2.HealthListRequest, grpc_context: Any = None
    ) -> health_pb2.HealthListResponse:
        """grpc.health.v1: the status of every service this server answers for."""
        response = health_pb2.HealthListResponse()
        if self._health_request(request, grpc_context, health_pb2.HealthListRequest) is not None:
            for service, status in self.service.health_statuses().items():
                response.statuses[service].status = status
        return response

    async def Watch(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, grpc_context: Any = None
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """grpc.health.v1 Watch is not offered (probes use Check): UNIMPLEMENTED, which the
        protocol lets a server answer. A stream must raise for Serve to send the status."""
        details = "Watch is not offered: use Check"
        if self._health_request(request, grpc_context, health_pb2.HealthCheckRequest) is None:
            details = "bad health request"  # the status (INVALID_ARGUMENT, ...) is on the context
        elif grpc_context is not None:
            grpc_context.set_code(grpc.StatusCode.UNIMPLEMENTED)
            grpc_context.set_details(details)
        raise CallFailed(details)
        yield  # unreachable: makes Watch an async generator, as Serve streams it

    def _health_request(self, request: Any, grpc_context: Any, message_type: type) -> Any:
        """A health call's request, parsed from its bytes and authorized where health is not
        open; None after putting the failure's status on the context."""
        try:
            if not self.open_health:
                self._authorize(grpc_context)
            return parse(request, message_type)
        except (AuthenticationError, ValueError) as exc:
            _fail(exc, grpc_context)
            return None

    def __del__(self) -> None:
        closed = getattr(self, "_closed", None)
        if closed is not None:
            closed.set()
        backend = getattr(getattr(self, "service", None), "backend", None)
        if backend is not None:
            backend.close()
