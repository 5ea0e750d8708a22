"""The `specdec` command: the core's `generate`, plus `serve` (this file) and `client`.

`specdec serve` starts Ray (or joins one with --address), the draft worker, the target
group and the Serve app (gRPC and the OpenAI-compatible HTTP API), prints one line naming
both endpoints when ready, and on SIGINT / SIGTERM drains the routers within
serving.shutdown_grace_s and shuts everything down with exit status 0
(specdec_cli/graceful_stop.py), also while it is still starting (specdec_cli/stop_signals.py). A start that
fails (e.g. resources that never appear within serving.placement_timeout_s) exits 1 with one
line naming what is missing, after releasing what it started.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from specdec.wiring import cli as core_cli
from specdec.proposers import proposer_registry as registry
from specdec_redis.local_redis import LocalRedis, redis_server_binary
from specdec_cli.graceful_stop import drain_and_stop
from specdec_cli.stop_signals import Interrupted, StopSignals
from specdec.config.config import SpecdecConfig, load_config
from specdec.wiring.startup_check import check_startup
from specdec.serving.api_auth import check_security_files
from specdec.models.model_paths import check_model_paths
from specdec_cli.client_cli import add_client_parser, add_status_parser
from specdec_cli.drain_cli import add_drain_parser
from specdec_cli.profile_cli import add_profile_parser


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
    return load_config(*args.config, overrides={"serving": serving} if serving else {})  # errors name the file


def _with_load_store(config: SpecdecConfig) -> tuple[SpecdecConfig, LocalRedis | None, str]:
    """Without a Redis URL, start a local redis-server child when one is installed."""
    from actors.backend import redis_url

    if not config.load_monitor.enabled:
        return config, None, "load monitor off"
    if redis_url(config):
        return config, None, f"Redis {redis_url(config)}"
    if redis_server_binary() is None:
        return config, None, "in-process load store (redis-server not found; set load_monitor.redis_url to share)"
    local = LocalRedis().start().keep_alive()  # started again if it dies
    data = config.model_dump()
    data["load_monitor"]["redis_url"] = local.url
    return SpecdecConfig.model_validate(data), local, f"local redis-server {local.url}"


def run_serve(args: argparse.Namespace) -> int:
    config = _serve_config(args)
    check_startup(config)  # what the router and workers build from it, before Ray starts
    check_model_paths(config.models, draft_needed=config.speculation.proposer == registry.DRAFT)  # before Ray starts
    check_security_files(config.security)
    from actors.app import start_app  # ray and serve only for this subcommand
    from specdec_cli.local_workers import secure_local_workers

    config = secure_local_workers(config, joining=args.address is not None)
    config, local_redis, store = _with_load_store(config)
    logging.getLogger("ray").setLevel(logging.WARNING)
    stops = StopSignals().install()
    try:
        try:
            app = start_app(config, address=args.address,
                            ray_init_kwargs={"logging_level": logging.WARNING, "log_to_driver": False},
                            progress=lambda stage: print(f"specdec serve: {stage} ...", file=sys.stderr, flush=True))
        except BaseException as exc:  # reported in one line; start_app released everything
            if stops.received is None and not isinstance(exc, Exception):
                raise
            if stops.received is not None:  # (Ray's C++ waits may wrap Interrupted in a SystemError)
                print(f"specdec serve: {Interrupted(stops.received)} while starting; what had started is shut down",
                      file=sys.stderr, flush=True)
                return 0  # a stop asked for and done
            print(f"specdec serve: failed to start: {_one_line(exc)}", file=sys.stderr, flush=True)
            return 1
        try:
            _print_ready(config, app, store)
            stops.wait()
        except Interrupted as stop:
            drain_and_stop(app, str(stop))
        finally:
            app.shutdown()  # (idempotent: after a drain there is nothing left to stop)
    finally:
        if local_redis is not None:
            local_redis.stop()
    return 0


def _print_ready(config: SpecdecConfig, app: Any, store: str) -> None:
    """What serves where, once every part has started (``store``: where the load statistics live)."""
    serving = config.serving
    proposer = config.speculation.proposer
    draft = "draft ready" if proposer == registry.DRAFT else f"proposer {proposer}"
    print(f"specdec serving on {serving.host}:{serving.port} "
          f"(target tp={serving.tensor_parallel_size}, {draft}, {store}); "
          f"OpenAI-compatible HTTP on {'https' if config.security.tls_cert_file else 'http'}://"
          f"{serving.host}:{serving.http_port}/v1", flush=True)
    if app.direct_addresses:  # serving.ingress direct: a client takes them comma-separated
        print(f"specdec router replicas' own ports: gRPC {','.join(app.direct_addresses)}; "
              f"HTTP {' '.join(app.direct_http_urls)}", flush=True)


def _one_line(exc: BaseException) -> str:
    """The root cause of a start failure in one line (Ray wraps a remote error in a
    RayTaskError whose text carries the remote traceback)."""
    cause = getattr(exc, "cause", None)
    root = cause if isinstance(cause, BaseException) else exc
    if type(root).__name__ == "StartFailed":  # actors.start_failure: already the reason, in one line
        return str(root)
    return f"{type(root).__name__}: {str(root).strip().splitlines()[-1] if str(root).strip() else ''}"


def build_parser() -> argparse.ArgumentParser:
    return core_cli.build_parser(extra_subcommands=(add_serve_parser, add_client_parser, add_status_parser,
                                                       add_profile_parser, add_drain_parser))


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
