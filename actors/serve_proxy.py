"""What specdec sets up inside Ray Serve's proxy process, through Serve's start-up hook.

Serve's ProxyActor calls the function named by the environment variable
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH while it is being created, before it starts its
HTTP and gRPC servers, and wraps its HTTP app in the Starlette middlewares it returns.
`setup_proxy` is that function:
* Serve's gRPC port binds where `specdec_rpc.public.proxy_binding` says (`serving.host`, or
  loopback when the TLS port of `specdec_rpc.public.public_tls` is the public one);
* a router replica that dies mid-request ends HTTP requests as 503 / an SSE error event
  (`specdec_http.replica_loss`; its gRPC counterpart is a servicer function,
  `specdec_rpc.public.replica_loss`).
The proxy inherits the variable from Ray: `specdec serve` sets it before it starts Ray
(`actors.serve_endpoints`), the Helm chart on the head container.
"""

from __future__ import annotations

from starlette.middleware import Middleware

from specdec_http.replica_loss import ReplicaLossMiddleware
from specdec_rpc.public import proxy_binding

CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "actors.serve_proxy.setup_proxy"


def setup_proxy() -> list[Middleware]:
    """Serve's proxy start-up hook (see the module doc)."""
    proxy_binding.install()
    return [Middleware(ReplicaLossMiddleware)]
