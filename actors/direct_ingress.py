"""Where clients reach the router replicas' own ports (`serving.ingress: direct`).

With Serve's direct ingress on, the Serve controller hands each router replica a gRPC and an
HTTP port (from `serving.direct_port` / `serving.direct_http_port` on, `actors.serve_endpoints`)
and lists them, once the replica's servers started, as the application's target groups
(`ServeController.get_target_groups`: Ray 2.60 has no public API for it; Serve's own test
utilities read it the same way). `direct_addresses` turns them into addresses a client on
this machine dials: a replica on this node at `serving.host` (loopback for a wildcard), one
on another node at that node's address. A client spreads its calls over several of them
(`specdec_rpc.public.client`: a comma-separated target is dialled round-robin).
"""

from __future__ import annotations

import time

import ray

from specdec.config.config import ServingConfig
from specdec_rpc.public.proxy_binding import host_port, local_host

REPLICA_PREFIX = "SERVE_REPLICA::"  # the controller's name of a replica's target (the proxies' differ)


def direct_targets(app_name: str, protocol: str = "gRPC") -> list[tuple[str, int]]:
    """(node address, port) of every running router replica's own `protocol` port."""
    from ray.serve.context import _get_global_client

    groups = ray.get(_get_global_client()._controller.get_target_groups.remote(app_name))
    return sorted((t.ip, t.port) for g in groups if g.protocol.value == protocol for t in g.targets
                  if t.name.startswith(REPLICA_PREFIX))


def direct_addresses(app_name: str, serving: ServingConfig, protocol: str = "gRPC") -> list[str]:
    """Where a client on this machine reaches each router replica's own `protocol` port."""
    here = ray.util.get_node_ip_address()
    return [host_port(local_host(serving.host) if ip == here else ip, port)
            for ip, port in direct_targets(app_name, protocol)]


def wait_for_direct_addresses(app_name: str, serving: ServingConfig, timeout_s: float,
                              protocol: str = "gRPC") -> list[str]:
    """`direct_addresses` once every router replica lists one (TimeoutError after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = direct_addresses(app_name, serving, protocol)
        if len(found) >= serving.router_replicas:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(found)} of {serving.router_replicas} router replicas list a direct "
                               f"{protocol} port after {timeout_s:g}s: {found}")
        time.sleep(0.5)
