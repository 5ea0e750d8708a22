"""Start and stop the whole distributed server: Ray, the draft worker, the tensor-parallel
target group, Ray Serve's gRPC and HTTP proxies and the SpecdecRouter deployment.

`start_app(config)` returns once the public gRPC port answers health checks with SERVING
(draft and target loaded) and the HTTP port's /health answers 200; `SpecdecApp.shutdown()`
tears everything down in reverse order. Both proxies bind `serving.host`; gRPC listens on
`serving.port`, the OpenAI-compatible HTTP API on `serving.http_port`. With `serving.ingress:
direct` each router replica also serves both on ports of its own (`SpecdecApp.direct_addresses`,
`direct_http_urls`: `actors.direct_ingress`), which skip Serve's proxy process.
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import ray
from ray import serve
from ray.serve.config import ProxyLocation

from ray.serve import Application

from actors.backend import cluster_backend, monitored_backend
from actors.direct_ingress import wait_for_direct_addresses
from specdec.wiring.ports import free_port  # noqa: F401 - re-exported for callers of start_app
from actors.router import SpecdecRouter
from actors.router_drain import drain_routers
from actors.signal_handlers import kept_signal_handlers
from actors.start_failure import StartFailed, explained, router_load_failure
from actors.serve_endpoints import ServeEndpoints, direct_environment, export_environment, probe_token, serve_endpoints
from actors.worker_hub import get_or_create_hub, start_hub, stop_hub
from specdec.config.config import SpecdecConfig, load_config
from specdec_rpc.public.client import SpecdecClient
from specdec.serving.served_engine import ServedEngine

logger = logging.getLogger(__name__)

APP_NAME = "specdec"
RAY_NAMESPACE = "specdec"
REPO_ROOT = Path(__file__).resolve().parent.parent
#: Serve's own queue sits in front of the router's admission limit; keep it out of the way
SERVE_HEADROOM = 32


@dataclass
class SpecdecApp:
    """A running server. `address` is where clients on this machine reach the public gRPC
    port, `http_url` the OpenAI-compatible HTTP API's base URL (http://127.0.0.1:PORT)."""

    config: SpecdecConfig
    address: str
    http_url: str = ""
    target_address: str | None = None
    draft_address: str | None = None
    hub: Any = None  # the WorkerHub actor holding the target group and the draft (None with an injected backend)
    #: serving.ingress direct: each router replica's own gRPC port, as a client on this machine reaches it
    direct_addresses: list[str] = field(default_factory=list)
    direct_http_urls: list[str] = field(default_factory=list)  # ... and its own HTTP API's base URL
    owns_ray: bool = False
    _stoppers: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def target_tp(self) -> int:
        return self.config.serving.tensor_parallel_size

    def drain(self, grace_s: float | None = None) -> list[dict[str, Any]]:
        """Drain every router replica (actors/router_drain.py) within grace_s (default:
        serving.shutdown_grace_s); call before shutdown() for a clean stop. Their reports."""
        grace = self.config.serving.shutdown_grace_s if grace_s is None else grace_s
        return drain_routers(APP_NAME, self.config.serving.router_replicas, grace)

    def shutdown(self) -> None:
        """Serve (proxy and router), then the target group and the draft, then Ray if we started it."""
        while self._stoppers:
            stop = self._stoppers.pop()
            try:
                stop()
            except Exception:
                logger.exception("shutdown step failed")


def _init_ray(address: str | None, ray_init_kwargs: dict[str, Any] | None) -> bool:
    """Start (or join) Ray; True when this process started it. The repo root goes on
    PYTHONPATH first, so Serve's proxy can import the stubs even without an install."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])
    if ray.is_initialized():
        return False
    # a named namespace: the WorkerHub is a named detached actor that later calls look up
    with kept_signal_handlers():  # Ray's driver would abort on SIGTERM instead of our clean stop
        ray.init(address=address, **{"namespace": RAY_NAMESPACE, **(ray_init_kwargs or {})})
    return True


def _start_workers(config: SpecdecConfig, app: SpecdecApp) -> Callable[[], ServedEngine]:
    """The target group and the draft worker (through the WorkerHub); returns the router's
    backend factory (remote workers + the load monitor)."""
    hub = get_or_create_hub(config)
    app._stoppers.append(functools.partial(stop_hub, config))
    app.target_address, app.draft_address = start_hub(hub)
    app.hub = hub
    return functools.partial(monitored_backend, config, app.target_address, app.draft_address)


def _workers_stage(config: SpecdecConfig) -> str:
    serving, models = config.serving, config.models
    gpus = serving.tensor_parallel_size * serving.target_num_gpus
    need = f"{gpus:g} GPU(s) on one node for the target" if gpus else "CPUs for the target"
    draft = f" and the draft ({models.draft})" if config.speculation.proposer == "draft" else ""
    return (f"placing and loading the target ({models.target}, {serving.tensor_parallel_size} shard(s), "
            f"{need}){draft}; waiting at most {serving.placement_timeout_s:g}s for the placement")


def router_deployment(config: SpecdecConfig, backend_factory: Callable[[], ServedEngine]) -> Application:
    """The SpecdecRouter bound to its backend factory, sized from config.serving."""
    router = SpecdecRouter.options(
        num_replicas=config.serving.router_replicas,
        max_ongoing_requests=config.serving.max_concurrent_requests + SERVE_HEADROOM,
    )
    return router.bind(backend_factory, config.security, config.models.target)


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Ray Serve application builder for `serve deploy` and KubeRay's serveConfigV2
    (`import_path: actors.app:build_app`). `args` are specdec config overrides (the schema of
    configs/default.yaml); the router's replicas get the workers from the WorkerHub. With
    serving.ingress direct, Ray must have started with the direct ingress environment."""
    config = load_config(overrides=dict(args or {}))
    _check_direct_environment(config)
    return router_deployment(config, functools.partial(cluster_backend, config))


def _check_direct_environment(config: SpecdecConfig) -> None:
    """serving.ingress direct needs Ray's processes started with Serve's direct ingress on and
    the config's port ranges (the builder runs in a Ray process, whose environment is theirs):
    the Helm chart sets them on the Ray containers from `specdec.config.serving`; a Ray started
    without them is refused, naming what is missing."""
    if config.serving.ingress != "direct":
        return
    missing = sorted(k for k, v in direct_environment(config.serving).items() if os.environ.get(k) != v)
    if missing:
        raise ValueError(f"serving.ingress direct: Ray's processes must start with {', '.join(missing)} as "
                         "serving's direct ports give them (the Helm chart sets them from specdec.config.serving, "
                         "`specdec serve` when it starts Ray); or use ingress proxy")


def _start_serve(
    config: SpecdecConfig, backend_factory: Callable[[], ServedEngine], endpoints: ServeEndpoints
) -> None:
    serve.start(proxy_location=ProxyLocation.HeadOnly, http_options=endpoints.http, grpc_options=endpoints.grpc)
    # the route prefix "/" puts the OpenAI paths (/v1/...) at the root of the HTTP port and
    # makes the app an endpoint of the gRPC proxy too
    serve.run(router_deployment(config, backend_factory), name=APP_NAME, route_prefix="/")


def wait_until_serving(address: str, timeout_s: float, token: str | None = None,
                       failed: Callable[[], str | None] = lambda: None) -> None:
    """Poll grpc.health.v1 on `address` until SERVING (raises TimeoutError; StartFailed as
    soon as `failed` names a reason the start cannot succeed)."""
    deadline = time.monotonic() + timeout_s
    status = "no answer"
    with SpecdecClient(address, timeout_s=5.0, retries=0, token=token) as client:
        while time.monotonic() < deadline:
            reason = failed()
            if reason is not None:
                raise StartFailed(reason)
            try:
                status = client.health()
                if status == "SERVING":
                    return
            except grpc.RpcError as exc:
                status = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.5)
    raise TimeoutError(f"{address} did not become SERVING within {timeout_s}s (last: {status})")


def wait_until_http_ready(url: str, timeout_s: float, token: str | None = None) -> None:
    """Poll GET {url}/health until it answers 200 (raises TimeoutError). Over https the
    certificate is not verified: this only asks whether our own local proxy answers."""
    deadline = time.monotonic() + timeout_s
    status = "no answer"
    context = ssl._create_unverified_context() if url.startswith("https://") else None  # noqa: S323
    request = urllib.request.Request(f"{url}/health", headers={"authorization": f"Bearer {token}"} if token else {})
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=5.0, context=context) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            status = f"HTTP {exc.code}"
        except OSError as exc:
            status = str(exc)
        time.sleep(0.5)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s}s (last: {status})")


def _find_direct_ports(app: SpecdecApp, endpoints: ServeEndpoints, timeout_s: float) -> None:
    """The router replicas' own ports (serving.ingress direct), once each replica lists them and
    answers that it serves: a replica lists its ports while its backend still loads, and the
    probe before reached one replica only."""
    serving = app.config.serving
    app.direct_addresses = wait_for_direct_addresses(APP_NAME, serving, timeout_s)
    scheme = app.http_url.split("://", 1)[0]
    app.direct_http_urls = [f"{scheme}://{a}" for a in wait_for_direct_addresses(APP_NAME, serving, timeout_s, "HTTP")]
    wait_until_replicas_serve(app.direct_addresses, app.direct_http_urls, endpoints.tls, timeout_s,
                              probe_token(app.config), failed=functools.partial(router_load_failure, APP_NAME))


def wait_until_replicas_serve(addresses: list[str], http_urls: list[str], tls: bool, timeout_s: float,
                              token: str | None = None, failed: Callable[[], str | None] = lambda: None) -> None:
    """Each replica's own ports answer that it serves: its gRPC port's health SERVING where it
    speaks plaintext, and its HTTP port's /health 200 (over TLS the gRPC port has no plaintext
    twin to probe and the probe holds no CA to verify it with, so the HTTP port answers for the
    replica: the same replica, loaded or not)."""
    for address in () if tls else addresses:
        wait_until_serving(address, timeout_s, token, failed=failed)
    for url in http_urls:
        wait_until_http_ready(url, timeout_s, token)


def start_app(
    config: SpecdecConfig,
    address: str | None = None,
    backend_factory: Callable[[], ServedEngine] | None = None,
    ray_init_kwargs: dict[str, Any] | None = None,
    ready_timeout_s: float = 600.0,
    progress: Callable[[str], None] = logger.info,
) -> SpecdecApp:
    """Start everything and wait until it serves. backend_factory=None starts the draft
    worker and the target group; pass one (e.g. `build_served_engine` on the config) to serve in-process models.
    progress: told each stage as it begins (`specdec serve` prints them)."""
    endpoints = serve_endpoints(config)
    export_environment(endpoints, ray_started_here=address is None and not ray.is_initialized())
    app = SpecdecApp(config, address=endpoints.public_address, http_url=endpoints.http_url)
    progress(f"joining Ray at {address}" if address else "starting Ray (or using this process's)")
    app.owns_ray = _init_ray(address, ray_init_kwargs)
    if app.owns_ray:
        app._stoppers.append(ray.shutdown)
    try:
        if backend_factory is None:
            progress(_workers_stage(config))
            backend_factory = _start_workers(config, app)
        app._stoppers.append(serve.shutdown)
        progress("starting Serve's gRPC and HTTP proxies and the router; warming up")
        try:
            _start_serve(config, backend_factory, endpoints)
        except RuntimeError as exc:  # Serve's summary: name the replica's own exception
            raise explained(exc, APP_NAME) from exc
        wait_until_serving(endpoints.probe_address, ready_timeout_s, probe_token(config),
                           failed=functools.partial(router_load_failure, APP_NAME))
        wait_until_http_ready(app.http_url, ready_timeout_s, probe_token(config))
        if endpoints.direct:
            _find_direct_ports(app, endpoints, ready_timeout_s)
    except BaseException:
        app.shutdown()
        raise
    return app
