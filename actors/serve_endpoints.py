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
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from ray.serve.config import HTTPOptions, gRPCOptions

from specdec.wiring.ports import free_port
from actors.router import GRPC_SERVICER_FUNCTIONS
from actors.serve_proxy import CALLBACK, CALLBACK_ENV
from specdec.serving.api_auth import read_tokens
from specdec.config.config import SpecdecConfig
from specdec_rpc.public.proxy_binding import HOST_ENV, LOOPBACK, host_port, local_host
from specdec_rpc.public.public_tls import CERT_ENV, KEY_ENV, PORT_ENV, SERVICER_FUNCTION, tls_environment

logger = logging.getLogger(__name__)


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


def serve_endpoints(config: SpecdecConfig, internal_grpc_port: int | None = None) -> ServeEndpoints:
    """The proxies' options for `config` (internal_grpc_port: Serve's plaintext gRPC port
    when TLS is on; default: a free port)."""
    serving, security = config.serving, config.security
    local = local_host(serving.host)
    public = host_port(local, serving.port)
    environment = {CALLBACK_ENV: CALLBACK, HOST_ENV: serving.host}
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


def probe_token(config: SpecdecConfig) -> str | None:
    """A token for start-up readiness checks when health checks need one (open_health false)."""
    if config.security.open_health:
        return None
    tokens = read_tokens(config.security.api_tokens_file)
    return tokens[0] if tokens else None


def export_environment(endpoints: ServeEndpoints, ray_started_here: bool) -> None:
    """Put the proxy's settings into this process's environment, which a Ray started
    afterwards passes on. Joining a running Ray, they must already be in its environment
    with TLS (else the TLS port could be bypassed); without TLS a missing hook is logged."""
    if ray_started_here:
        if not endpoints.tls:  # an earlier TLS app in this process must not leave them to this Ray
            for name in (PORT_ENV, CERT_ENV, KEY_ENV):
                os.environ.pop(name, None)
        os.environ.update(endpoints.environment)
        return
    missing = sorted(k for k, v in endpoints.environment.items() if os.environ.get(k) != v)
    if endpoints.tls and missing:
        raise ValueError(
            "security.tls_cert_file: gRPC TLS is added inside Serve's proxy, which reads "
            f"{', '.join(sorted(endpoints.environment))} from its environment; start Ray with them set "
            "(specdec serve sets them when it starts Ray itself)"
        )
    if missing:
        logger.warning("Ray was started without %s: Serve's gRPC port binds every interface and a dead router "
                       "replica's HTTP requests end as Serve leaves them", ", ".join(missing))
