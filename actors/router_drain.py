"""Draining every router replica of a running app before it is torn down (SIGTERM / SIGINT
of `specdec serve`, `specdec drain` in a Kubernetes preStop hook).

Serve's handle routes each call to one replica, so the drain is asked until every replica
has answered (each has its own id; a replica asked twice waits for its one drain). A replica
drains as `specdec.serving.drain` says: new requests refused as unavailable, in-flight ones given
`grace_s`, the rest ended as unavailable, its engine loop stopped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ray import serve

logger = logging.getLogger(__name__)
#: beyond the grace period: the replicas' own loop stop and the calls' round trips
MARGIN_S = 15.0
ATTEMPTS_PER_REPLICA = 8


def drain_routers(app_name: str, replicas: int, grace_s: float) -> list[dict[str, Any]]:
    """Each replica's drain report (fewer when some did not answer within the grace period
    and the margin; they are torn down regardless)."""
    try:
        handle = serve.get_app_handle(app_name)
    except Exception as exc:  # no such app (it never started): nothing to drain
        logger.warning("nothing to drain: %s", exc)
        return []
    reports: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + grace_s + MARGIN_S
    attempts = 0
    while len(reports) < replicas and attempts < ATTEMPTS_PER_REPLICA * replicas:
        calls = [handle.drain.remote(grace_s) for _ in range(replicas - len(reports))]
        attempts += len(calls)
        for call in calls:
            left = deadline - time.monotonic()
            if left <= 0:
                return list(reports.values())
            try:
                report = call.result(timeout_s=left)
            except Exception as exc:  # a replica that died or timed out: torn down regardless
                logger.warning("a router replica did not drain: %s", exc)
                continue
            reports[report["replica"]] = report
    return list(reports.values())
