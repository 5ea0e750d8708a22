"""The end of `specdec serve` after SIGTERM / SIGINT: drain, then tear down, then exit 0.

Every router replica stops admitting (UNAVAILABLE / 503), in-flight requests get
`serving.shutdown_grace_s` to finish and the rest end as unavailable (actors/router_drain.py,
specdec/serving/drain.py); then Serve, the workers, Ray and the local redis-server are stopped, so no
process is left. Each step prints one line on stderr.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def say(line: str) -> None:
    print(f"specdec serve: {line}", file=sys.stderr, flush=True)


def drain_and_stop(app: Any, why: str) -> None:
    """Drain `app` (a SpecdecApp) within its grace period, then shut it down."""
    grace = app.config.serving.shutdown_grace_s
    say(f"{why}: draining (new requests refused; in-flight ones get up to {grace:g}s)")
    started = time.monotonic()
    try:
        reports = app.drain(grace)
    except Exception as exc:  # a drain that fails must not keep the processes alive
        say(f"drain failed ({type(exc).__name__}: {exc}); shutting down anyway")
        reports = []
    in_flight = sum(r["in_flight"] for r in reports)
    cancelled = sum(r["cancelled"] for r in reports)
    say(f"drained {len(reports)} router replica(s) in {time.monotonic() - started:.1f}s: "
        f"{in_flight - cancelled} of {in_flight} in-flight request(s) finished, {cancelled} ended as unavailable; "
        "shutting down")
    app.shutdown()
