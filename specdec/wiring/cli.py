"""`specdec` command line. `specdec generate` runs the in-process engine (no Ray)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from specdec.proposers import proposer_registry as registry
from specdec.config.config import SpecdecConfig, load_config
from specdec.models.model_paths import check_model_paths
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams


def add_generate_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("generate", help="generate text in-process (no Ray) with speculative decoding")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generated-token budget (default: config)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="uint64 seed keying the request's random draws")
    p.add_argument("--proposer", choices=registry.NAMES, default=None, help="override the config's")
    p.add_argument("--gamma", type=int, default=None,
                   help="a fixed γ, tokens proposed per round (default: the goodput policy chooses each round)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--stop-token-id", action="append", type=int, default=[], dest="stop_token_ids",
                   help="token id that ends generation like EOS (repeatable)")
    p.add_argument("--config", action="append", default=[], help="YAML override file(s), applied in order")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")
    p.set_defaults(func=run_generate)


def _config_from_args(args: argparse.Namespace) -> SpecdecConfig:
    overrides: dict[str, Any] = {"speculation": {}}
    if args.proposer is not None:
        overrides["speculation"]["proposer"] = args.proposer
    if args.gamma is not None:
        overrides["speculation"]["gamma"] = args.gamma
    return load_config(*args.config, overrides=overrides)


def run_generate(args: argparse.Namespace) -> int:
    from specdec.wiring.engine_builder import build_engine  # heavy imports only when needed

    config = _config_from_args(args)
    check_model_paths(config.models, draft_needed=config.speculation.proposer == registry.DRAFT)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else config.generation.max_new_tokens
    built = build_engine(config)
    mode = "auto" if args.gamma is None else "on"
    request = GenerationRequest(built.encode(args.prompt), max_new, sampling, stop=tuple(args.stop),
                                stop_token_ids=tuple(args.stop_token_ids), gamma=args.gamma, mode=mode)
    start = time.perf_counter()
    [result] = built.engine.generate([request])
    elapsed = time.perf_counter() - start
    if args.json:
        stats = result.stats.to_dict()
        stats["tokens_per_s"] = round(len(result.token_ids) / elapsed, 2)
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason, "stats": stats}))
    else:
        print(args.prompt + result.text)
    return 0


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specdec")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(extra_subcommands: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """The `specdec` parser with `generate`; each of `extra_subcommands` adds more subcommands
    (it receives the subparsers object, like add_generate_parser) - the shells add `serve`
    and `client` this way without the core importing them."""
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--log-level", default="WARNING", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="how much specdec logs to stderr (default WARNING; INFO shows start-up progress)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(subparsers)
    for add_subcommand in extra_subcommands:
        add_subcommand(subparsers)
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Run a subcommand; bad input exits 2 with a message naming the field."""
    args = (parser or build_parser()).parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:  # bad input: one line, no traceback
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
