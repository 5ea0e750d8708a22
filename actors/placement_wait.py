"""Waiting for resources (a placement group, an actor): patient, bounded, logged, and clear
about what is missing.

GPU nodes may take minutes to boot (autoscaler, KubeRay), so the wait is configurable
(`serving.placement_timeout_s`); progress is logged every `PROGRESS_PERIOD_S`; when it
expires the error says what the group needs and what the cluster has, node by node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

logger = logging.getLogger(__name__)

PROGRESS_PERIOD_S = 10.0


class PlacementTimeout(TimeoutError):
    """The resources could not be had in time; the message names what is missing."""


def wait_scheduled(ready: Any, what: str, bundles: list[dict[str, float]], strategy: str, timeout_s: float,
                   period_s: float = PROGRESS_PERIOD_S, report: Callable[[str], None] | None = None) -> None:
    """Wait until the object ref `ready` (a placement group's ready(), an actor's __ray_ready__)
    is ready; log progress every period_s (also to `report`); PlacementTimeout (naming `what`)
    after timeout_s."""
    start = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - start)
        if left <= 0:
            raise PlacementTimeout(
                f"{what} could not be scheduled within {timeout_s:.0f}s: {missing(bundles, strategy)}")
        if ray.wait([ready], timeout=min(period_s, left))[0]:
            return
        line = f"still waiting for {what} ({time.monotonic() - start:.0f}s of {timeout_s:.0f}s): "
        line += missing(bundles, strategy)
        logger.warning("%s", line)
        if report is not None:
            report(line)


def missing(bundles: list[dict[str, float]], strategy: str, nodes: list[dict[str, Any]] | None = None) -> str:
    """What the group needs against what the alive nodes have (totals, not what is free now)."""
    nodes = [n for n in (ray.nodes() if nodes is None else nodes) if n.get("Alive", True)]
    need = _sum(bundles)
    where = "on one node" if strategy.startswith("STRICT_PACK") else "in the cluster"
    have = [{k: v for k, v in n.get("Resources", {}).items() if k in need} for n in nodes]
    return (f"needs {len(bundles)} x {bundles[0]} = {need} {where}; "
            f"{len(nodes)} node(s) have {have or 'nothing'}")


def _sum(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + value
    return total
