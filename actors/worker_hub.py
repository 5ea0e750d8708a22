"""WorkerHub: starts the target group and the draft worker once, for every router replica.

`specdec serve`, `serve deploy` and KubeRay's RayService all reach the same hub: a named,
detached actor created with get_if_exists, so replicas (or a restarted router) never start
a second set of workers. The target group starts first: its STRICT_PACK placement group
must claim a node with enough GPUs before the draft could take one of them.
"""

from __future__ import annotations

from typing import Any

import ray

from specdec.config import SpecdecConfig


@ray.remote(num_cpus=0)
class WorkerHub:
    def __init__(self, config: SpecdecConfig) -> None:
        self.config = config
        self.group: Any = None
        self.draft: Any = None
        self.addresses: tuple[str, str | None] | None = None

    def start(self) -> tuple[str, str | None]:
        """(target leader address, draft address or None); starts them on the first call."""
        from actors.draft_worker import start_draft_worker
        from actors.target_group import TargetGroup

        if self.addresses is None:
            group = TargetGroup(self.config)
            target = group.start()
            self.group = group
            draft = None
            if self.config.speculation.proposer == "draft":
                self.draft, draft = start_draft_worker(self.config)
            self.addresses = (target, draft)
        return self.addresses

    def target_info(self) -> dict[str, Any]:
        return self.group.info()

    def shutdown(self) -> None:
        if self.draft is not None:
            try:
                ray.get(self.draft.stop.remote(), timeout=10)
            finally:
                ray.kill(self.draft)
                self.draft = None
        if self.group is not None:
            self.group.shutdown()
            self.group = None
        self.addresses = None


def hub_name(config: SpecdecConfig) -> str:
    return f"specdec-{config.load_monitor.deployment}-workers"


def get_or_create_hub(config: SpecdecConfig) -> Any:
    return WorkerHub.options(name=hub_name(config), get_if_exists=True, lifetime="detached").remote(config)


def stop_hub(config: SpecdecConfig) -> None:
    """Stop the workers and the hub itself (idempotent)."""
    try:
        hub = ray.get_actor(hub_name(config))
    except ValueError:
        return
    try:
        ray.get(hub.shutdown.remote(), timeout=60)
    finally:
        ray.kill(hub)
