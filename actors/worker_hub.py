"""WorkerHub: starts the target group and the draft worker once, for every router replica.

`specdec serve`, `serve deploy` and KubeRay's RayService all reach the same hub: a named,
detached actor in the `specdec` namespace created with get_if_exists, so replicas (or a
restarted router) never start a second set of workers. The target group starts first: its
STRICT_PACK placement group must claim a node with enough GPUs before the draft could take
one of them. The draft is kept by a DraftKeeper, which restarts it when it dies; routers
find the new one through `draft_address()` (see `draft_resolver`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import ray

from specdec.config import SpecdecConfig

logger = logging.getLogger(__name__)

HUB_NAMESPACE = "specdec"  # one namespace for the driver of `specdec serve` and Serve's replicas
RESOLVE_TIMEOUT_S = 5.0


@ray.remote(num_cpus=0, max_concurrency=8)
class WorkerHub:
    def __init__(self, config: SpecdecConfig) -> None:
        self.config = config
        self.group: Any = None
        self.keeper: Any = None  # DraftKeeper
        self.addresses: tuple[str, str | None] | None = None
        self._lock = threading.Lock()  # start and shutdown, one at a time

    def start(self) -> tuple[str, str | None]:
        """(target leader address, draft address or None); starts them on the first call."""
        from actors.draft_keeper import DraftKeeper
        from actors.target_group import TargetGroup

        with self._lock:
            if self.addresses is None:
                group = TargetGroup(self.config)
                target = group.start()
                self.group = group
                draft = None
                if self.config.speculation.proposer == "draft":
                    self.keeper = DraftKeeper(self.config)
                    draft = self.keeper.start()
                self.addresses = (target, draft)
            return self.addresses

    def draft_address(self) -> str | None:
        """The draft worker's address now (None while it restarts, or without a draft)."""
        return None if self.keeper is None else self.keeper.address()

    def draft_status(self) -> dict[str, Any] | None:
        """The keeper's view: address, restarts, down_reason, last_recovery_s (None without a draft)."""
        return None if self.keeper is None else self.keeper.status()

    def draft_actor(self) -> Any:
        """The draft worker's actor handle now (tests kill its process)."""
        return None if self.keeper is None else self.keeper.actor

    def target_info(self) -> dict[str, Any]:
        return self.group.info()

    def shutdown(self) -> None:
        with self._lock:
            keeper, self.keeper = self.keeper, None
            try:
                if keeper is not None:
                    keeper.stop()
            finally:
                if self.group is not None:
                    self.group.shutdown()
                    self.group = None
                self.addresses = None


def hub_name(config: SpecdecConfig) -> str:
    return f"specdec-{config.load_monitor.deployment}-workers"


def get_or_create_hub(config: SpecdecConfig) -> Any:
    return WorkerHub.options(
        name=hub_name(config), namespace=HUB_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(config)


def find_hub(config: SpecdecConfig) -> Any:
    """The running hub, or None."""
    try:
        return ray.get_actor(hub_name(config), namespace=HUB_NAMESPACE)
    except ValueError:
        return None


def draft_resolver(config: SpecdecConfig, address: str) -> Callable[[], str | None]:
    """For a router's RemoteProposer: the draft's address now, asked of the hub (the given
    address when there is no hub, e.g. workers started by hand)."""

    def resolve() -> str | None:
        hub = find_hub(config) if ray.is_initialized() else None
        if hub is None:
            return address
        return ray.get(hub.draft_address.remote(), timeout=RESOLVE_TIMEOUT_S)

    return resolve


def stop_hub(config: SpecdecConfig) -> None:
    """Stop the workers and the hub itself (idempotent)."""
    hub = find_hub(config)
    if hub is None:
        return
    try:
        ray.get(hub.shutdown.remote(), timeout=60)
    finally:
        ray.kill(hub)
