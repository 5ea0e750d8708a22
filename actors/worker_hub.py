"""WorkerHub: starts the target group and the draft worker once, for every router replica.

`specdec serve`, `serve deploy` and KubeRay's RayService all reach the same hub: a named,
detached actor in the `specdec` namespace created with get_if_exists, so replicas (or a
restarted router) never start a second set of workers. The target group starts first: its
STRICT_PACK placement group must claim a node with enough GPUs before the draft could take
one of them. The draft is kept by a DraftKeeper, which restarts it when it dies, and the
target group by a TargetKeeper, which re-forms it when a rank dies; routers find the new
ones through `draft_address()` / `target_address()` (`draft_resolver`, `target_resolver`).

The hub supervises the workers of one configuration, keyed by what they serve (`worker_key`:
models, dtype, device, cache, TP layout and resources, the draft or not). Deploying a
different configuration under the same deployment name replaces the hub: the old workers
are stopped and their placement groups released before the new ones start. When no router
has held a lease on the target for `serving.idle_release_s` (the application was shut down
or deleted: its replicas stopped renewing), the hub releases the workers and exits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from actors.placement_wait import PROGRESS_PERIOD_S
from specdec.config.config import SpecdecConfig

logger = logging.getLogger(__name__)

HUB_NAMESPACE = "specdec"  # one namespace for the driver of `specdec serve` and Serve's replicas
RESOLVE_TIMEOUT_S = 5.0
SHUTDOWN_LOCK_S = 1.0  # a shutdown waits this long for a start in progress, then leaves it to ray.kill
STOP_TIMEOUT_S = 30.0  # stop_hub: the hub's orderly shutdown, then it is killed
IDLE_CHECK_S = 5.0  # how often the hub asks the target how many routers hold a lease


@ray.remote(num_cpus=0, max_concurrency=8)
class WorkerHub:
    def __init__(self, config: SpecdecConfig) -> None:
        self.config = config
        self.target: Any = None  # TargetKeeper
        self.keeper: Any = None  # DraftKeeper
        self.addresses: tuple[str, str | None] | None = None
        self._lock = threading.Lock()  # start and shutdown, one at a time
        self.stage = "not started"
        self.key = worker_key(config)
        self._idle = threading.Thread(target=self._release_when_idle, name="hub-idle", daemon=True)
        self._idle.start()

    def worker_key(self) -> str:
        """What these workers serve (see `worker_key`)."""
        return self.key

    def _release_when_idle(self) -> None:
        """Shut the workers down and exit once no router has held a lease for idle_release_s."""
        idle_s = self.config.serving.idle_release_s
        if idle_s <= 0:
            return
        idle_since: float | None = None
        while True:
            time.sleep(min(IDLE_CHECK_S, idle_s / 2))
            leases = self._leases()
            if leases is None or leases > 0:
                idle_since = None
                continue
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= idle_s:
                logger.warning("no router for %.0fs: releasing the workers", idle_s)
                self.shutdown()
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return

    def _leases(self) -> int | None:
        """Routers holding a lease on the target now (None: not started, or it does not answer)."""
        target = self.target
        if target is None:
            return None
        try:
            return int(target.info()["leases"])
        except Exception:  # noqa: BLE001 - a target that does not answer is not idle
            return None

    def start(self) -> tuple[str, str | None]:
        """(target leader address, draft address or None); starts them on the first call."""
        from actors.draft_keeper import DraftKeeper
        from actors.target_keeper import TargetKeeper

        with self._lock:
            if self.addresses is None:
                self.stage = "starting the target group"
                target_keeper = TargetKeeper(self.config, report=self._report)
                target = target_keeper.start()  # on failure it released what it made
                draft = None
                try:
                    if self.config.speculation.proposer == "draft":
                        self.stage = "starting the draft worker"
                        draft_keeper = DraftKeeper(self.config)
                        draft = draft_keeper.start()
                        self.keeper = draft_keeper
                except BaseException:
                    target_keeper.stop()  # a draft failure must not leak the target's placement group
                    raise
                self.target, self.addresses = target_keeper, (target, draft)
                self.stage = "serving"
            return self.addresses

    def _report(self, line: str) -> None:
        self.stage = line

    def progress(self) -> str:
        """What start() is doing now (e.g. which resources it still waits for)."""
        return self.stage

    def draft_address(self) -> str | None:
        """The draft worker's address now (None while it restarts, or without a draft)."""
        return None if self.keeper is None else self.keeper.address()

    def draft_status(self) -> dict[str, Any] | None:
        """The keeper's view: address, restarts, down_reason, last_recovery_s (None without a draft)."""
        return None if self.keeper is None else self.keeper.status()

    def draft_actor(self) -> Any:
        """The draft worker's actor handle now (tests kill its process)."""
        return None if self.keeper is None else self.keeper.actor

    def emulated_devices(self) -> dict[str, list[dict[str, Any]]]:
        """The emulated devices of the draft worker and the target leader (ServedActor.emulated_devices):
        what a benchmark reads to know the device time of the rounds it ran."""
        group = None if self.target is None else self.target.group
        actors = {"draft": self.draft_actor(), "target": None if group is None else group.leader}
        return {role: [] if actor is None else ray.get(actor.emulated_devices.remote(), timeout=30)
                for role, actor in actors.items()}

    def target_info(self) -> dict[str, Any]:
        return self.target.info()

    def target_address(self) -> str:
        """The target leader's address now; None while the group is re-formed; "" when the
        hub has no target (not started or shut down: no target will come)."""
        return "" if self.target is None else self.target.address()

    def target_status(self) -> dict[str, Any] | None:
        """The keeper's view: address, restarts, down_reason, last_recovery_s."""
        return None if self.target is None else self.target.status()

    def shutdown(self) -> bool:
        """Stop the draft and the target group; False when a start still runs (killing the
        hub then releases what it made: its actors and placement groups share its fate)."""
        if not self._lock.acquire(timeout=SHUTDOWN_LOCK_S):
            return False
        try:
            keeper, self.keeper = self.keeper, None
            if keeper is not None:
                keeper.stop()
        finally:
            if self.target is not None:
                self.target.stop()
                self.target = None
            self.addresses = None
            self._lock.release()
        return True


def worker_key(config: SpecdecConfig) -> str:
    """A short hash of everything that decides which workers serve: two configurations with
    the same key can share workers, others cannot."""
    serving = config.serving
    spec = {
        "models": config.models.model_dump(), "cache": config.cache.model_dump(),
        "draft": config.speculation.proposer == "draft",
        "serving": {name: getattr(serving, name) for name in (
            "tensor_parallel_size", "target_num_gpus", "draft_num_gpus", "target_num_cpus", "draft_num_cpus",
            "distributed_backend", "lease_ttl_s")},
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


def hub_name(config: SpecdecConfig) -> str:
    return f"specdec-{config.load_monitor.deployment}-workers"


def get_or_create_hub(config: SpecdecConfig) -> Any:
    """The hub for this configuration; a hub of the same deployment that serves another
    configuration (a redeploy with another model, dtype, TP size, ...) is stopped first."""
    key = worker_key(config)
    old = find_hub(config)
    if old is not None and _key_of(old) != key:
        logger.warning("deployment %r: replacing workers of another configuration with %s",
                       config.load_monitor.deployment, key)
        _stop(old)
        _wait_until_gone(config)
    return WorkerHub.options(
        name=hub_name(config), namespace=HUB_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(config)


def _key_of(hub: Any) -> str | None:
    try:
        return ray.get(hub.worker_key.remote(), timeout=RESOLVE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - a hub that does not answer is replaced
        return None


def _wait_until_gone(config: SpecdecConfig, timeout_s: float = 30.0) -> None:
    """Until the hub's name is free again (ray.kill is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while find_hub(config) is not None and time.monotonic() < deadline:
        time.sleep(0.1)


def start_hub(hub: Any, period_s: float = PROGRESS_PERIOD_S) -> tuple[str, str | None]:
    """hub.start(), logging its progress here every period_s (the hub's own log is on its node)."""
    started = hub.start.remote()
    waited = 0.0
    while not ray.wait([started], timeout=period_s)[0]:
        waited += period_s
        try:
            stage = ray.get(hub.progress.remote(), timeout=RESOLVE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - progress is only informative
            stage = f"(no progress report: {type(exc).__name__})"
        logger.warning("starting the workers (%.0fs): %s", waited, stage)
    return ray.get(started)


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


def target_resolver(config: SpecdecConfig, address: str) -> Callable[[], str | None]:
    """For a router's RemoteVerifier: the target leader's address now (None while the group
    is re-formed, "" when the hub is gone or stopped), asked of the hub."""

    def resolve() -> str | None:
        if not ray.is_initialized():
            return address
        hub = find_hub(config)
        return "" if hub is None else ray.get(hub.target_address.remote(), timeout=RESOLVE_TIMEOUT_S)

    return resolve


def stop_hub(config: SpecdecConfig) -> None:
    """Stop the workers and the hub itself (idempotent)."""
    hub = find_hub(config)
    if hub is not None:
        _stop(hub)


def _stop(hub: Any) -> None:
    """The hub's orderly shutdown (bounded), then kill it."""
    try:
        ray.get(hub.shutdown.remote(), timeout=STOP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - killed below either way
        logger.warning("the worker hub did not shut down cleanly (%s); killing it", exc)
    finally:
        ray.kill(hub)  # its actors and placement groups go with it
