"""Waiting for resources (a placement group, an actor): patient, bounded, logged, and clear
about what is missing.

GPU nodes may take minutes to boot (autoscaler, KubeRay), so the wait is configurable
(`serving.placement_timeout_s`); progress is logged every `PROGRESS_PERIOD_S`; when it
expires the error says what the group needs and what the cluster has, node by node, and
which placement groups already reserve those resources (e.g. the target's group holding the
CPUs a draft worker waits for), with what is free now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

logger = logging.getLogger(__name__)

PROGRESS_PERIOD_S = 10.0
#: the name the target's placement group starts with (so a wait can say who holds what)
TARGET_GROUP_PREFIX = "specdec-target"


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


def missing(bundles: list[dict[str, float]], strategy: str, nodes: list[dict[str, Any]] | None = None,
            groups: dict[str, dict[str, Any]] | None = None, free: dict[str, float] | None = None) -> str:
    """What the group needs against what the alive nodes have (totals), which placement groups
    reserve part of that (`ray.util.placement_group_table()`) and what is free now."""
    nodes = [n for n in (ray.nodes() if nodes is None else nodes) if n.get("Alive", True)]
    need = _sum(bundles)
    where = "on one node" if strategy.startswith("STRICT_PACK") else "in the cluster"
    have = [{k: v for k, v in n.get("Resources", {}).items() if k in need} for n in nodes]
    line = f"needs {len(bundles)} x {bundles[0]} = {need} {where}; {len(nodes)} node(s) have {have or 'nothing'}"
    held = _held(need, ray.util.placement_group_table() if groups is None else groups)
    if held:
        free = ray.available_resources() if free is None else free
        line += f", of which {held}; free now: {({k: free.get(k, 0.0) for k in need})}"
    return line


def _held(need: dict[str, float], groups: dict[str, dict[str, Any]]) -> str:
    """'<who> reserves <what>' for each created placement group holding resources in `need`."""
    held = []
    for group in groups.values():
        bundles = [{k: v for k, v in b.items() if k in need} for b in group.get("bundles", {}).values()]
        if group.get("state") != "CREATED" or not any(bundles):
            continue
        name = group.get("name") or ""
        who = "the target's group" if name.startswith(TARGET_GROUP_PREFIX) else f"placement group {name or '(unnamed)'}"
        held.append(f"{who} reserves {len(bundles)} x {bundles[0]} = {_sum(bundles)}")
    return "; ".join(held)


def _sum(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + value
    return total
