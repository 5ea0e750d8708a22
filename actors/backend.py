"""The router's backend in a cluster: workers from the WorkerHub, the load monitor on Redis.

Called inside each router replica (the factories are pickled into it), so the Redis
connection and the monitor's thread live where they are used.
"""

from __future__ import annotations

import os
import socket
import uuid

from actors.worker_hub import draft_resolver, get_or_create_hub, start_hub, target_resolver
from specdec.config.config import SpecdecConfig
from specdec.policy.load_monitor import LoadMonitor, build_load_monitor
from specdec.policy.load_store import LoadStore
from specdec.wiring.engine_builder import build_served_engine
from specdec.serving.served_engine import ServedEngine
from specdec_rpc.worker.router_backend import remote_parts

REDIS_URL_ENV = "SPECDEC_REDIS_URL"
REDIS_PASSWORD_ENV = "SPECDEC_REDIS_PASSWORD"


def redis_url(config: SpecdecConfig) -> str:
    """The configured Redis URL, else the SPECDEC_REDIS_URL environment variable ('' = none)."""
    return config.load_monitor.redis_url or os.environ.get(REDIS_URL_ENV, "")


def load_store(config: SpecdecConfig) -> LoadStore | None:
    """The shared RedisLoadStore, or None (the monitor then keeps in-process measurements)."""
    url = redis_url(config)
    if not url:
        return None
    from specdec_redis.redis_load_store import RedisLoadStore

    lm = config.load_monitor
    return RedisLoadStore(url, lm.deployment, lm.window_s, lm.bucket_s, lm.replica_ttl_s,
                          timeout_s=lm.timeout_s, password=os.environ.get(REDIS_PASSWORD_ENV) or None,
                          cost_window_s=lm.cost_window_s)


def load_monitor(config: SpecdecConfig) -> LoadMonitor | None:
    if not config.load_monitor.enabled:
        return None
    replica_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return build_load_monitor(config.load_monitor, load_store(config), replica_id)


def monitored_backend(config: SpecdecConfig, target_address: str, draft_address: str | None) -> ServedEngine:
    """The workers' served engine (remote_parts), the load monitor deciding γ and switching
    speculation under load."""
    monitor = load_monitor(config)
    # the workers may have been restarted since the app started (a replica that Serve
    # replaces later must not dial the dead ones): the hub knows where they serve now
    target_address = target_resolver(config, target_address)() or target_address
    if draft_address is not None:
        draft_address = draft_resolver(config, draft_address)() or draft_address
    # a restarted draft worker may serve elsewhere: the hub knows where
    resolve = draft_resolver(config, draft_address) if draft_address is not None else None
    # the core starts the monitor with the engine and stops it when the engine closes
    return build_served_engine(config, remote_parts(config, target_address, draft_address, resolve,
                                                    target_resolver(config, target_address), policy=monitor))


def cluster_backend(config: SpecdecConfig) -> ServedEngine:
    """For `serve deploy` / RayService: get (or start) the workers through the hub."""
    hub = get_or_create_hub(config)
    target_address, draft_address = start_hub(hub)
    return monitored_backend(config, target_address, draft_address)
