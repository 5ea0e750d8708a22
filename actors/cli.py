"""The `specdec` command: the core's `generate`, plus `serve` (this file) and `client`.

`specdec serve` starts Ray (or joins one with --address), the draft worker, the target
group and the Serve app (gRPC and the OpenAI-compatible HTTP API), prints one line naming
both endpoints when ready, and shuts everything down on
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
from specdec import proposer_registry as registry
from actors.local_redis import LocalRedis, redis_server_binary
from specdec.config import SpecdecConfig, load_config
from specdec.model_paths import check_model_paths
from specdec_rpc.client_cli import add_client_parser, add_status_parser


def add_serve_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="serve the public gRPC and OpenAI-compatible HTTP APIs with Ray "
                              "(draft + target actors, Serve router)")
    p.add_argument("--config", action="append", default=[], help="YAML override file(s), applied in order")
    p.add_argument("--port", type=int, default=None, help="public gRPC port (default: config serving.port, 50051)")
    p.add_argument("--http-port", type=int, default=None,
                   help="public HTTP port, the OpenAI-compatible API (default: config serving.http_port, 8000)")
    p.add_argument("--address", default=None, help="join this Ray cluster instead of starting a local one")
    p.add_argument("--tensor-parallel-size", type=int, default=None, help="target ranks (default: config)")
    p.set_defaults(func=run_serve)


def _serve_config(args: argparse.Namespace):
    serving: dict[str, Any] = {}
    if args.port is not None:
        serving["port"] = args.port
    if getattr(args, "http_port", None) is not None:
        serving["http_port"] = args.http_port
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


def _with_load_store(config: SpecdecConfig) -> tuple[SpecdecConfig, LocalRedis | None, str]:
    """Without a Redis URL, start a local redis-server child when one is installed."""
    from actors.backend import redis_url

    if not config.load_monitor.enabled:
        return config, None, "load monitor off"
    if redis_url(config):
        return config, None, f"Redis {redis_url(config)}"
    if redis_server_binary() is None:
        return config, None, "in-process load store (redis-server not found; set load_monitor.redis_url to share)"
    local = LocalRedis().start()
    data = config.model_dump()
    data["load_monitor"]["redis_url"] = local.url
    return SpecdecConfig.model_validate(data), local, f"local redis-server {local.url}"


def run_serve(args: argparse.Namespace) -> int:
    config = _serve_config(args)
    check_model_paths(config.models, draft_needed=config.speculation.proposer == registry.DRAFT)  # before Ray starts
    from actors.app import start_app  # ray and serve only for this subcommand

    config, local_redis, store = _with_load_store(config)
    logging.getLogger("ray").setLevel(logging.WARNING)
    try:
        app = start_app(config, address=args.address,
                        ray_init_kwargs={"logging_level": logging.WARNING, "log_to_driver": False})
        try:
            serving = config.serving
            proposer = config.speculation.proposer
            draft = "draft ready" if proposer == registry.DRAFT else f"proposer {proposer}"
            print(f"specdec serving on {serving.host}:{serving.port} "
                  f"(target tp={serving.tensor_parallel_size}, {draft}, {store}); "
                  f"OpenAI-compatible HTTP on http://{serving.host}:{serving.http_port}/v1", flush=True)
            _wait_for_signal()
        finally:
            app.shutdown()
    finally:
        if local_redis is not None:
            local_redis.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    return core_cli.build_parser(extra_subcommands=(add_serve_parser, add_client_parser, add_status_parser))


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
