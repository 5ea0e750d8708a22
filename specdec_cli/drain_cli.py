"""`specdec drain`: drain the routers of a running Ray Serve deployment (the Helm chart's
preStop hook on the Ray head, before Kubernetes sends SIGTERM).

Joins the Ray cluster (`--address`, default the local one), asks every replica of the app's
router to stop admitting and to give in-flight requests `--grace` seconds
(actors/router_drain.py), prints one line with what happened and exits 0; 1 when no router
answered. `specdec serve` does the same itself on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from typing import Any

from specdec.config.config import ServingConfig
from specdec_cli.client_cli import seconds

DEFAULT_GRACE_S = ServingConfig.model_fields["shutdown_grace_s"].default


def add_drain_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("drain", help="drain a running deployment's routers (refuse new requests, let "
                              "in-flight ones finish within the grace period)")
    p.add_argument("--address", default="auto", help="Ray cluster to join (default: the local one)")
    p.add_argument("--app", default="specdec", help="Serve application name (default specdec)")
    p.add_argument("--replicas", type=_at_least_one, default=1,
                   help="router replicas to reach (serving.router_replicas)")
    p.add_argument("--grace", type=functools.partial(seconds, zero=True), default=DEFAULT_GRACE_S,
                   help="seconds in-flight requests may run on "
                        f"(serving.shutdown_grace_s, default {DEFAULT_GRACE_S:g})")
    p.set_defaults(func=run_drain)


def _at_least_one(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number >= 1 expected, got {text!r}")
    return int(text)


def run_drain(args: argparse.Namespace) -> int:
    import ray  # only for this subcommand

    from actors.router_drain import drain_routers

    ray.init(address=args.address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        reports = drain_routers(args.app, args.replicas, args.grace)
    finally:
        ray.shutdown()
    in_flight = sum(r["in_flight"] for r in reports)
    cancelled = sum(r["cancelled"] for r in reports)
    print(f"specdec drain: {len(reports)} of {args.replicas} router replica(s) drained: "
          f"{in_flight - cancelled} of {in_flight} in-flight request(s) finished, {cancelled} ended as unavailable",
          file=sys.stderr, flush=True)
    return 0 if reports else 1
