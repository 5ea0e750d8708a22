"""Serve's two proxies configured from `serving` and `security`: the bind address, ports, TLS,
servicer functions, and the environment the proxy must inherit.

`serving.host` is the one bind address of the public ports, gRPC and HTTP (Serve's gRPC
proxy knows no host: `specdec_rpc.public.proxy_binding` binds it, from Serve's proxy start-up hook
`actors.serve_proxy`, named in the environment). Without TLS, Serve's gRPC proxy listens on
`serving.host:serving.port` and its HTTP proxy on `serving.host:serving.http_port`, both in
plaintext. With `security.tls_cert_file` / `tls_key_file`:
* HTTP: Serve's HTTP proxy serves HTTPS itself (its ssl options); there is no plaintext port;
* gRPC: Serve's gRPC proxy has no TLS option, so `specdec_rpc.public.public_tls`'s servicer
  function adds a TLS port on `serving.host:serving.port` inside the proxy, and Serve's own
  plaintext port moves to an internal port (`internal_grpc_port`) on loopback, where only
  this host's start-up probes reach it.
The proxy reads these settings from its environment, which it inherits from Ray:
`environment` must be in the environment before Ray starts (`specdec serve` does this when it
starts Ray). A dead router replica's calls end as UNAVAILABLE / 503 for every client
(`specdec_rpc.public.replica_loss`'s servicer function, listed first; the hook's HTTP middleware).
Bearer tokens need nothing here: the router checks them (`security.api_tokens_file`).
With `serving.ingress: direct` the environment also turns on Serve's direct ingress: each
router replica serves gRPC and HTTP on ports of its own (`direct_environment`), bound and
secured inside the replica as the proxy's (`specdec_rpc.public.direct_port`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from ray.serve.config import HTTPOptions, gRPCOptions

from specdec.wiring.ports import free_port
from actors.router import GRPC_SERVICER_FUNCTIONS
from actors.serve_proxy import CALLBACK, CALLBACK_ENV
from actors.stack_environment import export_stack_environment
from specdec.serving.api_auth import read_tokens
from specdec.config.config import ServingConfig, SpecdecConfig
from specdec.config.config_rules import direct_ports
from specdec_rpc.public.proxy_binding import HOST_ENV, LOOPBACK, host_port, local_host
from specdec_rpc.public.public_tls import CERT_ENV, KEY_ENV, PORT_ENV, SERVICER_FUNCTION, tls_environment

logger = logging.getLogger(__name__)

DIRECT_ENV = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
#: every variable `direct_environment` sets
DIRECT_NAMES = (DIRECT_ENV, *(f"RAY_SERVE_DIRECT_INGRESS_{end}_{kind}_PORT" for end in ("MIN", "MAX")
                              for kind in ("GRPC", "HTTP")), "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S",
                "RAY_SERVE_PORT_QUARANTINE_S")


@dataclass(frozen=True)
class ServeEndpoints:
    http: HTTPOptions
    grpc: gRPCOptions
    public_address: str  # where clients on this machine reach the gRPC API (TLS when configured)
    http_url: str  # the HTTP API's base URL on this machine (https:// with TLS)
    probe_address: str  # plaintext gRPC for start-up readiness checks on this machine
    environment: dict[str, str] = field(default_factory=dict)  # what Serve's proxy must inherit

    @property
    def tls(self) -> bool:
        return PORT_ENV in self.environment

    @property
    def direct(self) -> bool:
        """True with `serving.ingress: direct` (the router replicas' own ports)."""
        return DIRECT_ENV in self.environment


def serve_endpoints(config: SpecdecConfig, internal_grpc_port: int | None = None) -> ServeEndpoints:
    """The proxies' options for `config` (internal_grpc_port: Serve's plaintext gRPC port
    when TLS is on; default: a free port)."""
    serving, security = config.serving, config.security
    local = local_host(serving.host)
    public = host_port(local, serving.port)
    environment = {CALLBACK_ENV: CALLBACK, HOST_ENV: serving.host, **direct_environment(serving)}
    if not security.tls_cert_file:
        return ServeEndpoints(
            http=HTTPOptions(host=serving.host, port=serving.http_port),
            grpc=gRPCOptions(port=serving.port, grpc_servicer_functions=GRPC_SERVICER_FUNCTIONS),
            public_address=public, http_url=f"http://{host_port(local, serving.http_port)}", probe_address=public,
            environment=environment,
        )
    environment.update(tls_environment(serving.port, security.tls_cert_file, security.tls_key_file))
    internal = internal_grpc_port or free_port()
    return ServeEndpoints(
        http=HTTPOptions(host=serving.host, port=serving.http_port, ssl_certfile=security.tls_cert_file,
                         ssl_keyfile=security.tls_key_file),
        grpc=gRPCOptions(port=internal, grpc_servicer_functions=[*GRPC_SERVICER_FUNCTIONS, SERVICER_FUNCTION]),
        public_address=public, http_url=f"https://{host_port(local, serving.http_port)}",
        probe_address=host_port(LOOPBACK, internal), environment=environment,
    )


def direct_environment(serving: ServingConfig) -> dict[str, str]:
    """What Ray's processes need for the router replicas' own ports (`serving.ingress: direct`):
    Serve's direct ingress on, its port ranges from the config; Serve's minimum draining
    period and its quarantine of a released port (both for external load balancers such as
    HAProxy) off: `specdec serve` drains the routers itself, and a replica that replaces a dead
    one takes the port its clients already know."""
    if serving.ingress != "direct":
        return {}
    grpc_ports = direct_ports(serving.direct_port, serving.router_replicas)
    http_ports = direct_ports(serving.direct_http_port, serving.router_replicas)
    return {DIRECT_ENV: "1", "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(grpc_ports.start),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(grpc_ports.stop),  # Serve's bound is exclusive
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http_ports.start),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http_ports.stop),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0", "RAY_SERVE_PORT_QUARANTINE_S": "0"}


def probe_token(config: SpecdecConfig) -> str | None:
    """A token for start-up readiness checks when health checks need one (open_health false)."""
    if config.security.open_health:
        return None
    tokens = read_tokens(config.security.api_tokens_file)
    return tokens[0] if tokens else None


def export_environment(endpoints: ServeEndpoints, ray_started_here: bool) -> None:
    """Put the proxy's settings into this process's environment, which a Ray started
    afterwards passes on, with Serve's quieter background where the operator set none
    (actors/stack_environment.py). Joining a running Ray, the proxy's must already be in its
    environment with TLS (else the TLS port could be bypassed); without TLS a missing hook is
    logged."""
    if ray_started_here:
        export_stack_environment()
        # an earlier TLS or direct app in this process must not leave its settings to this Ray
        stale = (*(() if endpoints.tls else (PORT_ENV, CERT_ENV, KEY_ENV)), *(() if endpoints.direct else DIRECT_NAMES))
        for name in stale:
            os.environ.pop(name, None)
        os.environ.update(endpoints.environment)
        return
    missing = sorted(k for k, v in endpoints.environment.items() if os.environ.get(k) != v)
    if endpoints.direct and missing:
        raise ValueError(
            "serving.ingress direct: Ray Serve starts the router replicas' own ports only when Ray's processes "
            f"start with {', '.join(sorted(endpoints.environment))} set; start Ray with them (specdec serve sets "
            "them when it starts Ray itself) or use serving.ingress proxy"
        )
    if endpoints.tls and missing:
        raise ValueError(
            "security.tls_cert_file: gRPC TLS is added inside Serve's proxy, which reads "
            f"{', '.join(sorted(endpoints.environment))} from its environment; start Ray with them set "
            "(specdec serve sets them when it starts Ray itself)"
        )
    if missing:
        logger.warning("Ray was started without %s: Serve's gRPC port binds every interface and a dead router "
                       "replica's HTTP requests end as Serve leaves them", ", ".join(missing))
