"""The draft worker: a Ray actor holding the draft model, serving `specdec.v1.DraftWorker` over gRPC.

It is an async actor: the grpc.aio server runs on the actor's event loop, the model work on
the servicer's worker thread. At start it loads the draft and checks it against the
target's tokenizer (a mismatch fails the start, naming the differing ids).
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from specdec.config.config import SpecdecConfig
from specdec_metrics.worker_metrics import WorkerMetrics
from specdec_rpc.worker.draft_servicer import DraftServicer
from actors.placement_wait import wait_scheduled
from actors.served_actor import ServedActor, own_cores


@ray.remote
class DraftWorkerActor(ServedActor):
    """One draft model and its slot cache behind a gRPC port."""

    async def start(self, config: SpecdecConfig, host: str | None = None, port: int = 0) -> str:
        """Load the draft (with the tokenizer check) and serve; returns 'node_ip:port'."""
        own_cores(config.serving.draft_num_cpus)
        metrics = WorkerMetrics(model=config.models.target, role="draft")  # exported by this actor
        servicer = await asyncio.get_running_loop().run_in_executor(None, DraftServicer.from_config, config, metrics)
        return await self._serve(servicer, host, port, config)


def start_draft_worker(config: SpecdecConfig, name: str | None = None) -> tuple[Any, str]:
    """Start the draft worker actor (resources from config.serving) and wait until it serves.

    Returns (actor handle, 'ip:port'). If loading fails the actor is killed and the error raised."""
    options: dict[str, Any] = {
        "num_cpus": config.serving.draft_num_cpus,
        "num_gpus": config.serving.draft_num_gpus,
    }
    if name is not None:
        options["name"] = name
    actor = DraftWorkerActor.options(**options).remote()
    try:
        bundle = {k: v for k, v in (("CPU", options["num_cpus"]), ("GPU", options["num_gpus"])) if v > 0}
        wait_scheduled(actor.__ray_ready__.remote(), "the draft worker", [bundle], "PACK",
                       config.serving.placement_timeout_s)
        address = ray.get(actor.start.remote(config), timeout=config.serving.start_timeout_s)
    except BaseException:
        ray.kill(actor)
        raise
    return actor, address
