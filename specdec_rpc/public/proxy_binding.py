"""Where Ray Serve's gRPC proxy listens: `serving.host`, the one bind address of both protocols.

Serve binds its HTTP proxy to `HTTPOptions.host`, but its gRPC proxy to every interface:
`start_grpc_server` (ray/serve/_private/grpc_util.py) adds "[::]:PORT" through
`ray.serve._private.default_impl.add_grpc_address`, and gRPCOptions has no host. With TLS
(`specdec_rpc.public.public_tls`) that plaintext port would stay open on the network beside the
TLS one, and bearer tokens would cross it unencrypted.

`install()` replaces that function in the proxy's process (it runs in the proxy's start-up
hook, `actors.serve_proxy`, before Serve creates its gRPC server), so that Serve's port binds
* `serving.host` (env SPECDEC_BIND_HOST) without TLS: it is the public port;
* loopback with TLS: it is internal (start-up probes on the host), and the TLS port that
  `public_tls` adds binds `serving.host`.
The address actually bound is recorded on the server, so that `public_tls` refuses to add a
TLS port beside a plaintext port that is not loopback (fail closed, e.g. without the hook).
Inside a router replica (`serving.ingress: direct`) the server is the replica's own, and
`specdec_rpc.public.direct_port` binds it (TLS on `serving.host` when configured).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Any

HOST_ENV = "SPECDEC_BIND_HOST"
LOOPBACK = "127.0.0.1"
WILDCARDS = ("0.0.0.0", "::", "")
_BOUND = "specdec_plaintext_address"  # attribute of Serve's server: where its plaintext port went


def host_port(host: str, port: int | str) -> str:
    """A gRPC address: IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def local_host(host: str) -> str:
    """Where a client on this machine reaches a port bound to `host` (loopback for a wildcard)."""
    return LOOPBACK if host in WILDCARDS else host


def is_loopback(address: str | None) -> bool:
    """True for an address (host:port) that only this machine can reach."""
    if not address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as IPv6 sockets list it
    return (mapped or ip).is_loopback


def serve_grpc_address(address: str, environ: Mapping[str, str] | None = None) -> str:
    """Where Serve's own (plaintext) gRPC port binds instead of `address` ("[::]:PORT")."""
    from specdec_rpc.public.public_tls import PORT_ENV  # public_tls imports this module

    environ = os.environ if environ is None else environ
    port = address.rsplit(":", 1)[1]
    if environ.get(PORT_ENV):
        return host_port(LOOPBACK, port)
    host = environ.get(HOST_ENV)
    return address if host is None else host_port(host or "::", port)


def add_grpc_address(server: Any, address: str) -> None:
    """Serve's hook, replaced: bind where `serve_grpc_address` says and record it (inside a
    router replica, its direct-ingress port: `specdec_rpc.public.direct_port`)."""
    from specdec_rpc.public import direct_port  # it imports this module

    if direct_port.in_replica():
        direct_port.bind(server, address)
        return
    bound = serve_grpc_address(address)
    server.add_insecure_port(bound)
    setattr(server, _BOUND, bound)


def plaintext_address(server: Any) -> str | None:
    """Where Serve's plaintext port of `server` was bound by `add_grpc_address` (None: not by it)."""
    return getattr(server, _BOUND, None)


def install() -> None:
    """Make Serve's gRPC proxy in this process bind through `add_grpc_address`."""
    from ray.serve._private import default_impl

    default_impl.add_grpc_address = add_grpc_address
