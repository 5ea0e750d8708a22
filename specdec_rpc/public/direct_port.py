"""A router replica's own gRPC port (`serving.ingress: direct`): where it binds and how it speaks.

With Ray Serve's direct ingress (RAY_SERVE_ENABLE_DIRECT_INGRESS, set by `specdec serve`'s
environment: `actors.serve_endpoints`), every router replica starts a gRPC server of its own
(and an HTTP one) on a port the Serve controller hands it, so a client's stream reaches the
replica without Serve's proxy process. Serve creates that server as it creates the proxy's:
`start_grpc_server` adds "[::]:PORT" through `ray.serve._private.default_impl.add_grpc_address`,
which `specdec_rpc.public.proxy_binding` replaces in both processes; inside a replica it calls
`bind` here, so that the port
* binds `serving.host` (env SPECDEC_BIND_HOST), never every interface when the host says otherwise;
* speaks TLS whenever `security.tls_cert_file` is set (the certificate and key the proxy's TLS
  port uses): there is no plaintext port beside it, and the TLS servicer function
  (`specdec_rpc.public.public_tls`) adds nothing to such a server.
Bearer tokens need nothing here: the router checks them on every call, whichever port it came by.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from specdec_rpc.public.proxy_binding import HOST_ENV, host_port

_TLS = "specdec_direct_tls_address"  # attribute of a replica's server: the TLS address its one port binds


def in_replica() -> bool:
    """True inside a Ray Serve replica (where Serve's gRPC servers are direct-ingress ones)."""
    from ray.serve.context import _get_internal_replica_context

    return _get_internal_replica_context() is not None


def bind(server: Any, address: str, environ: Mapping[str, str] | None = None) -> str:
    """Bind a replica's direct gRPC server instead of `address` ("[::]:PORT"): `serving.host`, TLS
    when the environment names a certificate. Returns the address bound; RuntimeError when the
    port cannot be bound (Serve then tries another of its ports)."""
    from specdec_rpc.public.public_tls import CERT_ENV, KEY_ENV, server_credentials  # public_tls imports this

    environ = os.environ if environ is None else environ
    bound_address = host_port(environ.get(HOST_ENV) or "::", address.rsplit(":", 1)[1])
    if environ.get(CERT_ENV):
        bound = server.add_secure_port(bound_address, server_credentials(environ[CERT_ENV], environ[KEY_ENV]))
        setattr(server, _TLS, bound_address)
    else:
        bound = server.add_insecure_port(bound_address)
    if bound == 0:
        raise RuntimeError(f"cannot bind the router replica's direct gRPC port {bound_address}")
    return bound_address


def speaks_tls(server: Any) -> bool:
    """True for a replica's direct gRPC server whose one port `bind` bound with TLS."""
    return getattr(server, _TLS, None) is not None
