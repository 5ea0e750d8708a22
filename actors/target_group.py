"""TargetGroup: the tensor-parallel target as `tensor_parallel_size` rank actors in one placement group.

The placement group is STRICT_PACK with one bundle per rank ({"CPU": target_num_cpus,
"GPU": target_num_gpus}), so all ranks share a node (all-reduce per layer needs the fast
local interconnect). Rank 0 (the leader) finds the rendezvous address, every rank joins the
torch.distributed group and loads its shard, then the leader serves TargetWorker over gRPC.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.placement_wait import TARGET_GROUP_PREFIX, wait_scheduled
from actors.target_shard import TargetFollower, TargetLeader, check_tensor_parallel_size
from specdec.config.config import ServingConfig, SpecdecConfig

logger = logging.getLogger(__name__)
INFO_TIMEOUT_S = 10.0


def rank_bundle(serving: ServingConfig) -> dict[str, float]:
    """One rank's resources (zero entries left out: Ray rejects them)."""
    bundle = {"CPU": serving.target_num_cpus, "GPU": serving.target_num_gpus}
    bundle = {k: v for k, v in bundle.items() if v > 0}
    if not bundle:
        raise ValueError("serving.target_num_cpus and serving.target_num_gpus are both 0: a rank needs resources")
    return bundle


class TargetGroup:
    """Starts, describes and stops the target's rank actors. start() returns the leader's gRPC address."""

    def __init__(self, config: SpecdecConfig, name_prefix: str | None = None,
                 report: Callable[[str], None] | None = None) -> None:
        """report: told each progress line of a long start (the hub shows it to whoever waits)."""
        self.config = config
        self.report = report
        self.name_prefix = name_prefix
        self.tensor_parallel_size = config.serving.tensor_parallel_size
        self.placement_group: PlacementGroup | None = None
        self.leader: Any = None
        self.followers: list[Any] = []
        self.address: str | None = None

    def start(self) -> str:
        """Reserve the placement group, start and set up every rank, serve; returns 'ip:port'."""
        check_tensor_parallel_size(self.config)
        try:
            self._reserve()
            self.leader = self._actor(TargetLeader, 0)
            self.followers = [self._actor(TargetFollower, rank) for rank in range(1, self.tensor_parallel_size)]
            timeout_s = self.config.serving.start_timeout_s
            master = ray.get(self.leader.rendezvous.remote(), timeout=timeout_s)
            ranks = [self.leader, *self.followers]
            setups = [a.setup.remote(self.config, r, self.tensor_parallel_size, master) for r, a in enumerate(ranks)]
            ray.get(setups, timeout=timeout_s)
            self.address = ray.get(self.leader.serve.remote(self.followers), timeout=timeout_s)
            logger.info("target group serving at %s (tp=%d)", self.address, self.tensor_parallel_size)
        except BaseException:
            self.shutdown()
            raise
        return self.address

    def _reserve(self) -> None:
        bundles = [rank_bundle(self.config.serving)] * self.tensor_parallel_size
        # named, so that a resource wait elsewhere can say the target's group holds what it reserved
        name = f"{TARGET_GROUP_PREFIX}-{self.name_prefix or uuid.uuid4().hex[:8]}-pg"
        self.placement_group = placement_group(bundles, strategy="STRICT_PACK", name=name)
        what = "the target group's placement group"
        wait_scheduled(self.placement_group.ready(), what, bundles, "STRICT_PACK",
                       self.config.serving.placement_timeout_s, report=self.report)

    def _actor(self, actor_class: Any, rank: int) -> Any:
        serving = self.config.serving
        options: dict[str, Any] = {
            "num_cpus": serving.target_num_cpus,
            "num_gpus": serving.target_num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=rank
            ),
        }
        if self.name_prefix:
            options["name"] = f"{self.name_prefix}-rank{rank}"
        return actor_class.options(**options).remote()

    def info(self) -> dict[str, Any]:
        """The leader's WorkerInfo fields (model, slots, calls, sequences, max_batch_size, ...) and address."""
        if self.leader is None or self.address is None:
            raise RuntimeError("the target group is not started")
        return ray.get(self.leader.info.remote(), timeout=INFO_TIMEOUT_S)

    def shutdown(self, orderly: bool = True) -> None:
        """Stop serving, kill the rank actors and remove the placement group (idempotent).
        orderly=False skips the leader's stop (a hung group): the ranks are killed at once."""
        if self.leader is not None and orderly:
            try:
                ray.get(self.leader.stop.remote(), timeout=10)
            except Exception as exc:  # noqa: BLE001 - it is being killed anyway
                logger.warning("target leader did not stop cleanly: %s", exc)
        for actor in [self.leader, *self.followers]:
            if actor is not None:
                ray.kill(actor)
        self.leader, self.followers, self.address = None, [], None
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None
