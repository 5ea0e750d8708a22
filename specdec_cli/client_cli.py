"""`specdec client generate|health --server HOST:PORT[,HOST:PORT...]`: the command-line client of the public API.

Exit status: 0 on success (health: SERVING), 2 for INVALID_ARGUMENT (bad input, as with
`specdec generate`), 1 for any other gRPC error or a server that is not SERVING.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from specdec.proposers import proposer_registry as registry
from specdec.requests.speculation_mode import SpeculationMode
from specdec_rpc.public.client import SpecdecClient, check_target


TOKEN_ENV = "SPECDEC_API_TOKEN"


def add_client_parser(subparsers: Any) -> None:
    """Adds `client` with its `generate` and `health` subcommands."""
    client = subparsers.add_parser("client", help="call a running specdec server over gRPC")
    commands = client.add_subparsers(dest="client_command", required=True)
    gen = commands.add_parser("generate", help="generate text on the server")
    _add_common(gen)
    gen.add_argument("--prompt", required=True, help="prompt text")
    gen.add_argument("--max-new-tokens", type=int, default=0, help="generated-token budget (0 = the server's default)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1] (unset = off)")
    gen.add_argument("--seed", type=int, default=None, help="uint64 seed keying the request's random draws")
    gen.add_argument("--mode", choices=[m.value for m in SpeculationMode], default="auto",
                     help="speculation mode (default auto)")
    gen.add_argument("--gamma", type=int, default=0, help="γ, drafted tokens per round (0 = the server's)")
    gen.add_argument("--proposer", choices=registry.REQUESTABLE, default=None, help="the server's proposer if unset")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--stop-token-id", action="append", type=int, default=[], dest="stop_token_ids",
                     help="token id that ends generation like EOS (repeatable)")
    gen.add_argument("--stream", action="store_true", help="print tokens as the server confirms them")
    gen.add_argument("--json", action="store_true", help="print JSON (one object; with --stream one per chunk)")
    gen.set_defaults(func=run_client_generate)
    health = commands.add_parser("health", help="print the server's health status (SERVING / NOT_SERVING)")
    _add_common(health)
    health.set_defaults(func=run_client_health)


def add_status_parser(subparsers: Any) -> None:
    """Adds `status`: the live speculation picture of a running server as a table."""
    status = subparsers.add_parser("status", help="show γ, on/off, α, round costs and QPS of a running server")
    _add_common(status)
    status.add_argument("--json", action="store_true", help="print the GetStats response as JSON")
    status.set_defaults(func=run_status)


def format_status(stats: Any) -> str:
    """GetStatsResponse -> a readable two-column table."""
    per_position = ", ".join(f"{a:.2f}" for a in stats.acceptance_per_position) or "-"
    rows = [
        ("speculation", "on" if stats.speculation_enabled else "off"),
        ("gamma (AUTO requests)", str(stats.gamma)),
        ("why", stats.reason),
        ("acceptance rate α", f"{stats.acceptance_rate:.3f}"),
        ("α per position", per_position),
        ("round cost (ms)", _round_cost(stats)),
        ("speculation pays below", _crossover(stats)),
        (_qps_label(stats), f"{stats.qps:.2f}"),
        ("in flight / queued", f"{stats.in_flight:.0f} / {stats.queued:.0f}"),
        ("measurements", f"{stats.measurements_source} (Redis breaker {stats.circuit_breaker})"),
        ("replica rounds", str(stats.rounds)),
        ("replica drafted / accepted", f"{stats.drafted} / {stats.accepted}"),
        ("mean accepted length", f"{stats.mean_accepted_length:.2f} (window {stats.window_mean_accepted_length:.2f})"),
        ("requests running", str(stats.requests_running)),
        ("round (ms)", _profile(stats.round_profile)),
        ("drafting ahead", _drafting_ahead(stats.round_profile)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _qps_label(stats: Any) -> str:
    """Cluster-wide only while the measurements come from the shared store (Redis); else
    they are this replica's own (no Redis, or Redis unreachable)."""
    return "QPS (cluster)" if stats.measurements_source == "shared" else "QPS (this replica only)"


def _drafting_ahead(p: Any) -> str:
    """The look-ahead's hit rate, and the measured choice between looking ahead and not
    (with speculation.overlap)."""
    if not p.rows_drafted_ahead and not p.look_ahead_tokens_per_s:
        return "-"
    used = f"{p.look_ahead_hit_rate:.0%} of {p.rows_drafted_ahead} look-aheads used"
    if not (p.look_ahead_tokens_per_s or p.sequential_tokens_per_s):
        return used
    rate = lambda x: f"{x:.0f} tokens/s" if x else "not measured yet"  # noqa: E731
    return (f"{'on' if p.looking_ahead else 'off'} for a lone request; {used}; measured "
            f"{rate(p.look_ahead_tokens_per_s)} looking ahead, {rate(p.sequential_tokens_per_s)} without")


def _round_cost(stats: Any) -> str:
    if not stats.HasField("round_cost"):
        return "not measured yet"
    c = stats.round_cost
    return (f"verify {c.verify_fixed_ms:.2f} + {c.verify_row_ms:.2f}/row + {c.verify_drafted_token_ms:.2f}/drafted "
            f"token + {c.verify_prompt_token_ms:.3f}/prompt token (mean prompt {c.prompt_tokens:.0f}) "
            f"+ {c.verify_speculating_ms:.2f} when verifying drafts + {c.verify_prompt_round_ms:.2f} when "
            f"reading prompts, "
            f"draft {c.draft_fixed_ms:.2f} + {c.draft_step_ms:.2f}/step + {c.draft_row_step_ms:.2f}/row/step "
            f"+ {c.draft_catch_up_token_ms:.3f}/token read, "
            f"other {c.overhead_ms:.2f}; measured / predicted: drafting rounds x{c.drafting_scale:.2f}, "
            f"plain rounds x{c.plain_scale:.2f}")


def _crossover(stats: Any) -> str:
    if not stats.crossover_rows:
        return "unknown (or at any batch up to 256 rows)" if stats.HasField("round_cost") else "unknown"
    qps = f" ≈ {stats.crossover_qps:.1f} requests/s" if stats.crossover_qps else ""
    load = "; off now because of load" if stats.off_because_of_load else ""
    return f"~{stats.crossover_rows} rows per round{qps}{load}"


def _profile(p: Any) -> str:
    if not p.rounds:
        return "-"
    return (f"{p.round_ms:.2f} = draft {p.draft_compute_ms:.2f} + hop {p.draft_hop_ms:.2f}, "
            f"target {p.target_compute_ms:.2f} + hop {p.target_hop_ms:.2f}, router {p.bookkeeping_ms:.2f}")


def run_status(args: argparse.Namespace) -> int:
    with _connect(args) as client:
        try:
            stats = client.stats()
        except grpc.RpcError as exc:
            return _report(exc)
    print(_as_json(stats) if args.json else format_status(stats))
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default="127.0.0.1:50051", type=server_target,
                        help="HOST:PORT of the server (default 127.0.0.1:50051), or several comma-separated "
                             "(the router replicas' own ports, serving.ingress: direct)")
    parser.add_argument("--timeout", type=seconds, default=60.0, help="deadline of the call in seconds")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None,
                        help=f"bearer token, when the server requires one (default: env {TOKEN_ENV})")
    parser.add_argument("--tls-ca", default=None, metavar="PEM",
                        help="connect over TLS trusting this CA certificate ('' = the system's roots)")


def seconds(text: str, zero: bool = False) -> float:
    """A number of seconds > 0 (>= 0 with zero): argparse's type, anything else a usage error
    naming it (a 0 deadline would fail every call at once)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value >= 0 if zero else value > 0):
        raise argparse.ArgumentTypeError(f"must be {'>=' if zero else '>'} 0 seconds, got {text}")
    return value


def server_target(text: str) -> str:
    """--server as given, once it can be read (a list: every entry HOST:PORT, its IP addresses
    of one family). Its names are resolved once, when the client connects (`_connect`)."""
    try:
        check_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _connect(args: argparse.Namespace) -> SpecdecClient:
    """The client of --server; a list whose name does not resolve (or has no address of the
    list's family), or a --tls-ca that cannot be read, is bad input naming it (exit 2, as
    argparse's refusals)."""
    try:
        return SpecdecClient(args.server, timeout_s=args.timeout, token=args.token, tls_ca_file=args.tls_ca)
    except ValueError as exc:
        raise ValueError(f"argument --server: {exc}") from None
    except OSError as exc:  # (the CA file is the one file the client reads)
        raise ValueError(f"argument --tls-ca: cannot read {args.tls_ca!r}: {exc.strerror or exc}") from None


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "seed": args.seed, "mode": args.mode, "gamma": args.gamma,
        "proposer": args.proposer, "stop": args.stop, "stop_token_ids": args.stop_token_ids,
    }


def _as_json(message: Any) -> str:
    return json.dumps(MessageToDict(message, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True))


def run_client_generate(args: argparse.Namespace) -> int:
    with _connect(args) as client:
        try:
            if args.stream:
                _print_stream(client.generate_stream(args.prompt, **_fields(args)), args)
            else:
                response = client.generate(args.prompt, **_fields(args))
                print(_as_json(response) if args.json else args.prompt + response.text)
        except grpc.RpcError as exc:
            return _report(exc)
    return 0


def _print_stream(chunks: Any, args: argparse.Namespace) -> None:
    if not args.json:
        print(args.prompt, end="", flush=True)
    for chunk in chunks:
        print(_as_json(chunk) if args.json else chunk.text, end="\n" if args.json else "", flush=True)
    if not args.json:
        print()


def run_client_health(args: argparse.Namespace) -> int:
    with _connect(args) as client:
        try:
            status = client.health()
        except grpc.RpcError as exc:
            return _report(exc)
    print(status)
    return 0 if status == "SERVING" else 1


def _report(exc: grpc.RpcError) -> int:
    print(f"specdec: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
    return 2 if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else 1
