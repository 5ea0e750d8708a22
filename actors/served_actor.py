"""What the draft worker and the target leader share: a worker gRPC server inside an async actor."""

from __future__ import annotations

from typing import Any

import ray

from specdec.config.config import SpecdecConfig
from specdec_rpc.worker.internal_auth import configured_secret
from specdec_rpc.worker.worker_runtime import info_as_dict
from specdec_rpc.worker.worker_server import WorkerServer, start_worker_server


def own_cores(num_cpus: float) -> None:
    """Compute on as many torch threads as the actor reserved CPUs (at least one), so that
    the draft, each target rank and the router do not fight over the same cores."""
    import torch

    torch.set_num_threads(max(1, int(num_cpus)))


#: bind addresses that mean every interface: routers reach such a server at the node's address
WILDCARDS = {"0.0.0.0", "::", "[::]"}


class ServedActor:
    """Mixin for async Ray actors that serve one worker servicer: start, describe, stop."""

    _server: WorkerServer | None = None
    _address: str = ""
    _stopped: Any = None  # asyncio.Event, set by stop()

    def _stopped_event(self) -> Any:
        import asyncio

        if self._stopped is None:
            self._stopped = asyncio.Event()
        return self._stopped

    async def _serve(self, servicer: Any, host: str | None, port: int, config: SpecdecConfig) -> str:
        """Start the gRPC server on `host`, else `serving.worker_host`, else this node's address
        (which routers on other nodes reach; never every interface by default); returns the
        'host:port' routers call. Calls must present the cluster's internal secret when one
        is configured."""
        node_ip = ray.util.get_node_ip_address()
        secret = configured_secret(config.security.internal_secret_file)
        bind = host or config.serving.worker_host or node_ip
        self._server = await start_worker_server(servicer, bind, port, secret)
        reachable = node_ip if bind in WILDCARDS else bind
        self._address = f"{reachable}:{self._server.address.rsplit(':', 1)[1]}"
        return self._address

    async def info(self) -> dict[str, Any]:
        """The served WorkerInfo as a dict, plus the address."""
        return {"address": self._address, **info_as_dict(self._server.servicer.info())}

    async def emulated_devices(self) -> list[dict[str, Any]]:
        """This process's emulated devices and their busy time (benchmarks; empty unless a
        config names an emulated model)."""
        from specdec.models.emulated_device import process_devices

        return process_devices()

    async def until_stopped(self) -> None:
        """Returns once stop() ran; a caller waiting on it gets an error when the actor dies
        instead (how a supervisor notices the death at once)."""
        await self._stopped_event().wait()

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        self._stopped_event().set()
