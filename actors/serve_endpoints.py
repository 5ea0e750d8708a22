"""Serve's two proxies configured from `serving` and `security`: ports, TLS, servicer functions.

Without TLS, Serve's gRPC proxy listens on `serving.port` and its HTTP proxy on
`serving.host:serving.http_port`, both in plaintext. With `security.tls_cert_file` /
`tls_key_file`:
* HTTP: Serve's HTTP proxy serves HTTPS itself (its ssl options);
* gRPC: Serve's gRPC proxy has no TLS option, so `specdec_rpc.public_tls`'s servicer
  function adds a TLS port on `serving.port` inside the proxy, and Serve's own plaintext
  port moves to an internal port (`internal_grpc_port`). The proxy reads the TLS settings
  from its environment, which it inherits from Ray: `environment` must be in the
  environment before Ray starts (`specdec serve` does this when it starts Ray).
Bearer tokens need nothing here: the router checks them (`security.api_tokens_file`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ray.serve.config import HTTPOptions, gRPCOptions

from actors.ports import free_port
from actors.router import GRPC_SERVICER_FUNCTIONS
from specdec.api_auth import read_tokens
from specdec.config import SpecdecConfig
from specdec_rpc.public_tls import CERT_ENV, KEY_ENV, PORT_ENV, SERVICER_FUNCTION, tls_environment


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
        return bool(self.environment)


def serve_endpoints(config: SpecdecConfig, internal_grpc_port: int | None = None) -> ServeEndpoints:
    """The proxies' options for `config` (internal_grpc_port: Serve's plaintext gRPC port
    when TLS is on; default: a free port)."""
    serving, security = config.serving, config.security
    public = f"127.0.0.1:{serving.port}"
    if not security.tls_cert_file:
        return ServeEndpoints(
            http=HTTPOptions(host=serving.host, port=serving.http_port),
            grpc=gRPCOptions(port=serving.port, grpc_servicer_functions=GRPC_SERVICER_FUNCTIONS),
            public_address=public, http_url=f"http://127.0.0.1:{serving.http_port}", probe_address=public,
        )
    environment = tls_environment(serving.port, security.tls_cert_file, security.tls_key_file)
    internal = internal_grpc_port or free_port()
    return ServeEndpoints(
        http=HTTPOptions(host=serving.host, port=serving.http_port, ssl_certfile=security.tls_cert_file,
                         ssl_keyfile=security.tls_key_file),
        grpc=gRPCOptions(port=internal, grpc_servicer_functions=[*GRPC_SERVICER_FUNCTIONS, SERVICER_FUNCTION]),
        public_address=public, http_url=f"https://127.0.0.1:{serving.http_port}",
        probe_address=f"127.0.0.1:{internal}", environment=environment,
    )


def probe_token(config: SpecdecConfig) -> str | None:
    """A token for start-up readiness checks when health checks need one (open_health false)."""
    if config.security.open_health:
        return None
    tokens = read_tokens(config.security.api_tokens_file)
    return tokens[0] if tokens else None


def export_environment(endpoints: ServeEndpoints, ray_started_here: bool) -> None:
    """Put the proxy's TLS settings into this process's environment, which a Ray started
    afterwards passes on. Joining a running Ray, they must already be in its environment."""
    if not endpoints.tls:
        if ray_started_here:  # an earlier TLS app in this process must not leave them to this Ray
            for name in (PORT_ENV, CERT_ENV, KEY_ENV):
                os.environ.pop(name, None)
        return
    if ray_started_here:
        os.environ.update(endpoints.environment)
        return
    if os.environ.get(PORT_ENV) != endpoints.environment[PORT_ENV]:
        raise ValueError(
            "security.tls_cert_file: gRPC TLS is added inside Serve's proxy, which reads "
            f"{', '.join(sorted(endpoints.environment))} from its environment; start Ray with them set "
            "(specdec serve sets them when it starts Ray itself)"
        )
