"""The rank actors of the tensor-parallel target group.

Every rank joins the torch.distributed group, loads the target, keeps its shard
(`shard_model`) and builds a ModelRunner. Rank 0, the *leader*, is an async actor that
serves `specdec.v1.TargetWorker` over gRPC (grpc.aio on the actor's event loop) with a
TargetVerifier on a MirroredRunner; the other ranks, the *followers*, are plain threaded
actors (one call at a time, in submission order) that replay its cache operations and
forwards, sent as one `step` call per forward.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import ray
import torch.distributed as dist

from actors.mirrored_runner import MirroredRunner
from specdec.wiring.engine_builder import load_runner
from specdec.wiring.ports import free_port
from actors.served_actor import ServedActor, own_cores
from specdec.config.config import SpecdecConfig
from specdec.models.model_paths import resolve_model_path
from specdec.models.loader import load_model, model_config
from specdec.models.model_runner import ModelRunner
from specdec.models.tensor_parallel import check_divisible, shard_model
from specdec.verifiers.target_verifier import TargetVerifier
from specdec_metrics.worker_metrics import WorkerMetrics
from specdec_rpc.worker.target_servicer import TargetServicer

CACHE_OPERATIONS = frozenset({"allocate_slot", "grow_reserves", "free_slot", "truncate"})  # a follower replays
DIST_TIMEOUT = timedelta(minutes=5)  # a collective (or the rendezvous) that takes longer fails


def distributed_backend(config: SpecdecConfig) -> str:
    """'auto' -> nccl for a CUDA device, gloo otherwise."""
    backend = config.serving.distributed_backend
    if backend == "auto":
        return "nccl" if config.models.device.startswith("cuda") else "gloo"
    return backend


def check_tensor_parallel_size(config: SpecdecConfig) -> None:
    """Raise ValueError (naming the field) unless the target's heads split over the ranks, which needs the own
    runtime (UnsupportedModelError otherwise); reads config.json only. One rank always fits."""
    if config.serving.tensor_parallel_size == 1:
        return
    target = model_config(resolve_model_path(config.models.target))
    check_divisible(SimpleNamespace(config=target), config.serving.tensor_parallel_size)


class _Shard:
    """What every rank does: join the group, load and shard the target, build its runner."""

    runner: ModelRunner

    def rendezvous(self) -> tuple[str, int]:
        """This node's IP and a free port, for the group's MASTER_ADDR / MASTER_PORT."""
        return ray.util.get_node_ip_address(), free_port("")

    def _setup(self, config: SpecdecConfig, rank: int, world_size: int, master: tuple[str, int]) -> None:
        own_cores(config.serving.target_num_cpus)
        if world_size > 1:
            dist.init_process_group(
                distributed_backend(config),
                init_method=f"tcp://{master[0]}:{master[1]}",
                rank=rank,
                world_size=world_size,
                timeout=DIST_TIMEOUT,
            )
        models, cache = config.models, config.cache
        if world_size == 1:  # the own runtime, the transformers fallback or an emulated model (logged)
            self.runner = load_runner(models.target, models, cache)
            return
        path = resolve_model_path(models.target)
        model = load_model(path, dtype=models.dtype, device=models.device, time_scale=models.device_time_scale)
        # every rank holds the same number of K/V heads, so a budget gives every rank the same block pool
        self.runner = ModelRunner(shard_model(model, rank=rank, world_size=world_size), cache.num_slots,
                                  cache.max_seq_len, cache.block_size, memory_budget=cache.memory_budget,
                                  prefix_caching=cache.prefix_caching, kv_tokens=cache.kv_tokens)


@ray.remote
class TargetFollower(_Shard):
    """Rank > 0: replays the leader's cache operations and forwards (see MirroredRunner)."""

    def setup(self, config: SpecdecConfig, rank: int, world_size: int, master: tuple[str, int]) -> None:
        self._setup(config, rank, world_size, master)

    def allocate_slot(self, expected: int, reserve_tokens: int | None = None) -> None:
        slot = self.runner.allocate_slot(reserve_tokens)
        if slot != expected:
            self.runner.free_slot(slot)
            raise RuntimeError(f"follower allocated slot {slot}, the leader {expected}: the ranks diverged")

    def grow_reserves(self, reserves: list[tuple[int, int]], expected: int) -> None:
        """The leader's growth (only the reserves it raised): every one must fit here too."""
        grown = self.runner.grow_reserves(reserves)
        if grown != expected:
            raise RuntimeError(f"follower raised {grown} reserves, the leader {expected}: the ranks diverged")

    def free_slot(self, slot: int) -> None:
        self.runner.free_slot(slot)

    def truncate(self, slot: int, length: int) -> None:
        self.runner.truncate(slot, length)

    def forward(self, slot_ids: list[int], token_ids: list[list[int]], last_only: bool) -> None:
        self.runner.forward(slot_ids, token_ids, last_only)  # logits stay here: rank 0 answers

    def step(self, ops: list[tuple[str, tuple]], forward: tuple | None) -> None:
        """Apply the leader's cache operations in order, then its forward (None: none)."""
        for method, args in ops:
            if method not in CACHE_OPERATIONS:
                raise ValueError(f"unknown cache operation {method!r}")
            getattr(self, method)(*args)
        if forward is not None:
            self.forward(*forward)


@ray.remote
class TargetLeader(ServedActor, _Shard):
    """Rank 0: serves TargetWorker over gRPC; its verifier's runner mirrors to the followers."""

    async def setup(self, config: SpecdecConfig, rank: int, world_size: int, master: tuple[str, int]) -> None:
        """Blocks until every rank joined the group (run concurrently with the followers' setup)."""
        self._config, self._world_size = config, world_size
        await asyncio.get_running_loop().run_in_executor(None, self._setup, config, rank, world_size, master)

    async def serve(self, followers: list[Any], host: str | None = None, port: int = 0) -> str:
        """Start the gRPC server; returns 'node_ip:port'."""
        verifier = TargetVerifier(MirroredRunner(self.runner, followers))
        config = self._config
        metrics = WorkerMetrics(model=config.models.target, role="target", rank=0)  # exported by this actor
        servicer = TargetServicer(
            verifier, config.models.target, config.cache.num_slots, self._world_size, config.serving.lease_ttl_s,
            metrics
        )
        return await self._serve(servicer, host, port, config)
