"""The Ray Serve settings every specdec stack starts with: less background work between requests.

Ray Serve's defaults suit many small deployments changing often; specdec runs one application
of a few long-lived replicas, whose round trips (a few milliseconds each) share the host's
cores with Serve's own periodic work. Each setting here is a Serve environment variable, read
by Ray's processes when they start, so it must be in their environment before Ray starts:
`specdec serve` puts it there when it starts Ray itself (`export_stack_environment`), the Helm
chart on every Ray container, the cluster launcher configs on `ray start`. An operator's own
value of a variable wins (it is only set where absent). Measured figures: docs/emulated_devices.md
("The idle stack's background and the chunk's way out").

* `RAY_SERVE_CONTROL_LOOP_INTERVAL_S` 0.5 (Serve's default 0.1): the controller reconciles
  (replica states, health-check results, long-poll updates to the proxies) twice a second
  instead of ten times; each pass also reads from the GCS, so both spend about half as much
  CPU idle. A dead router replica is noticed at most 0.4 s later (its replacement takes
  seconds anyway: docs/faults.md), and replica health checks keep their own period.
* `RAY_SERVE_METRICS_EXPORT_INTERVAL_MS` 1000 (default 100): Serve's request counters are
  handed to Ray's metrics once a second instead of ten times; Ray reports them to the metrics
  agent every 10 s (`metrics_report_interval_ms`) and Prometheus scrapes every 10-15 s, so no
  sample is lost.
* `RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD` 0 (default 1; Serve's throughput-optimized mode
  sets 0 too): the router's methods run on the replica's own event loop, the one that serves
  the direct gRPC port, instead of on a second loop in a thread of its own, so a round's chunks
  reach the client's stream without a hop between two loops (one thread fewer to wake per
  chunk). The router never blocks its loop (tokenising runs on a worker thread, the engine on
  its own), and a wedged loop still fails Serve's health check, which then runs on that loop.
"""

from __future__ import annotations

import os

STACK_ENVIRONMENT: dict[str, str] = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
}


def export_stack_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Put STACK_ENVIRONMENT into `environ` (default: this process's environment, which a Ray
    started afterwards passes on to its processes) where a variable is not set already: an
    operator's own value wins. The settings now in force."""
    environ = os.environ if environ is None else environ
    for name, value in STACK_ENVIRONMENT.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in STACK_ENVIRONMENT}
