"""The `specdec` command: the core's `generate`, plus `serve` (this file) and `client`.

`specdec serve` starts Ray (or joins one with --address), the draft worker, the target
group and the Serve gRPC app, prints one line when ready, and shuts everything down on
SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from specdec import cli as core_cli
from specdec.config import load_config
from specdec_rpc.client_cli import add_client_parser


def add_serve_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="serve the public gRPC API with Ray (draft + target actors, Serve router)")
    p.add_argument("--config", action="append", default=[], help="YAML override file(s), applied in order")
    p.add_argument("--port", type=int, default=None, help="public gRPC port (default: config serving.port, 50051)")
    p.add_argument("--address", default=None, help="join this Ray cluster instead of starting a local one")
    p.add_argument("--tensor-parallel-size", type=int, default=None, help="target ranks (default: config)")
    p.set_defaults(func=run_serve)


def _serve_config(args: argparse.Namespace):
    serving: dict[str, Any] = {}
    if args.port is not None:
        serving["port"] = args.port
    if args.tensor_parallel_size is not None:
        serving["tensor_parallel_size"] = args.tensor_parallel_size
    return load_config(*args.config, overrides={"serving": serving})


def _wait_for_signal() -> int:
    """Block until SIGINT or SIGTERM; returns the signal number."""
    received: list[int] = []
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    while not stop.wait(0.5):
        pass
    return received[0]


def run_serve(args: argparse.Namespace) -> int:
    from actors.app import start_app  # ray and serve only for this subcommand

    config = _serve_config(args)
    logging.getLogger("ray").setLevel(logging.WARNING)
    app = start_app(config, address=args.address, ray_init_kwargs={"logging_level": logging.WARNING, "log_to_driver": False})
    try:
        serving = config.serving
        print(f"specdec serving on {serving.host}:{serving.port} (target tp={serving.tensor_parallel_size}, draft ready)",
              flush=True)
        _wait_for_signal()
    finally:
        app.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    return core_cli.build_parser(extra_subcommands=(add_serve_parser, add_client_parser))


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
