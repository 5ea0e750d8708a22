"""TLS on the public gRPC port, added inside Ray Serve's gRPC proxy.

Serve's gRPC proxy listens only in plaintext and has no TLS option, but it calls every
function named in `grpc_servicer_functions` with its server before starting it.
`add_tls_port_to_server` is such a function: it adds a TLS port (certificate and key
from files) on `serving.host` to the proxy's own server, beside Serve's plaintext port,
which `specdec_rpc.public.proxy_binding` binds to loopback (an internal port). It refuses to add
the TLS port when Serve's plaintext port is reachable from other hosts: TLS that a
plaintext port beside it bypasses is no TLS. It runs in the proxy's process, so its
settings travel as environment variables, set before Ray starts (`tls_environment`); in
Kubernetes the chart sets them on the head container.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from specdec_rpc.public import direct_port
from specdec_rpc.public.proxy_binding import HOST_ENV, host_port, is_loopback, plaintext_address

PORT_ENV, CERT_ENV, KEY_ENV = "SPECDEC_TLS_PORT", "SPECDEC_TLS_CERT_FILE", "SPECDEC_TLS_KEY_FILE"
SERVICER_FUNCTION = "specdec_rpc.public.public_tls.add_tls_port_to_server"


def tls_environment(port: int, cert_file: str, key_file: str) -> dict[str, str]:
    """The environment add_tls_port_to_server reads (checked here, where errors are readable)."""
    for key, path in (("security.tls_cert_file", cert_file), ("security.tls_key_file", key_file)):
        if not Path(path).is_file():
            raise ValueError(f"{key}: {path} is not a readable file")
    return {PORT_ENV: str(port), CERT_ENV: str(Path(cert_file).resolve()), KEY_ENV: str(Path(key_file).resolve())}


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(Path(key_file).read_bytes(), Path(cert_file).read_bytes())])


def add_tls_port_to_server(servicer: Any, server: Any, environ: Mapping[str, str] | None = None) -> None:
    """Add the TLS port the environment names to `server` (nothing when it names none)."""
    environ = os.environ if environ is None else environ
    port = environ.get(PORT_ENV)
    if not port or direct_port.speaks_tls(server):  # a router replica's own port: TLS already (direct_port)
        return
    if hasattr(server, "service_handler_factory") and not is_loopback(plaintext_address(server)):  # Serve's server
        raise OSError(
            f"Serve's plaintext gRPC port is bound to {plaintext_address(server) or 'every interface'}, where it "
            "would bypass TLS: Serve's proxy must start with specdec's hook (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
            "=actors.serve_proxy.setup_proxy in Ray's environment), which binds it to loopback"
        )
    address = host_port(environ.get(HOST_ENV) or "::", port)
    bound = server.add_secure_port(address, server_credentials(environ[CERT_ENV], environ[KEY_ENV]))
    if bound == 0:
        raise OSError(f"cannot bind the TLS port {address}")
