"""Speculation under a JSON schema: the draft proposing under the grammar's mask vs unmasked.

The same in-process engine (draft-model speculation at a fixed γ, one request at a time) runs
each prompt under a JSON schema twice per pass, the arms interleaved (A, B, A, B, ...): "masked"
is the engine as built (the draft masks its logits by the row's grammar), "unmasked" hands the
draft no grammar (what it did before), so it proposes tokens the target's mask forbids. The
outputs are the same for greedy and seeded requests either way (speculation is lossless); only
the acceptance rate and the speed differ. A free-text row (no schema) gives the unconstrained α.

Columns: α (accepted / proposed: the drafts before the grammar cuts them after their first
forbidden token; and accepted / verified: after the cut), mean accepted length (tokens per round, incl. the recovered or
bonus token), tokens/s (median over passes) and the masked/unmasked tokens/s ratio per pass
(median, min..max), and the grammar matchers' forks in this process (the engine's; with
--served the router's): how many per round and what they cost. Usage:
    python benchmarks/bench_grammar.py [--prompts 6] [--max-new-tokens 96] [--passes 3] [--gamma 4]
        [--temperature 0] [--profile h100-llama-8b-1b] [--served]
With `--profile` the pair is emulated (configs/devices/NAME.yaml): its device times are real
waits, so tokens/s shows what the acceptance rate is worth on that hardware. With `--served`
the engine is the router's (RemoteVerifier and RemoteProposer) and the draft and the target
are workers in processes of their own (DraftServicer, TargetServicer behind their gRPC
servers on 127.0.0.1, as `specdec serve` runs them, without Ray); "unmasked" then sends the
draft worker no grammar (what it did before HistoryDelta.grammar), "masked" sends it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import torch

from specdec.config.config import load_config
from specdec.models.model_paths import bundled_prompts
from specdec.proposers.base import Proposal, ProposalRequest, Proposer
from specdec.requests.grammar_spec import GrammarSpec
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.wiring.engine_builder import build_engine

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "language": {"type": "string", "enum": ["python", "c", "rust", "go"]},
    "summary": {"type": "string"}, "lines": {"type": "integer"},
    "functions": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "language", "summary", "lines", "functions"]}


class Arm(Proposer):
    """The engine's proposer, handed the rows' grammars (`masking`) or not (it drafts as if the
    output were free text), counting the tokens it proposes (before the grammar cuts them)."""

    def __init__(self, inner: Proposer, masking: bool) -> None:
        self.inner, self.has_probs, self.names = inner, inner.has_probs, inner.names
        self.masking = masking
        self.proposed = 0

    def _asks(self, requests: list[ProposalRequest]) -> list[ProposalRequest]:
        return requests if self.masking else [dataclasses.replace(r, grammar=None) for r in requests]

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        proposal = self.inner.propose(self._asks(requests))
        self.proposed += sum(len(drafts) for drafts in proposal)
        return proposal

    def look_ahead(self, requests: list[ProposalRequest], unverified: list[int], branches: int = 1):
        return self.inner.look_ahead(self._asks(requests), unverified, branches)

    def release(self, seq_id: str) -> None:
        self.inner.release(seq_id)


class Forks:
    """Counts and times every fork of an xgrammar matcher in this process."""

    def __init__(self) -> None:
        from specdec.sampling.grammar_xgrammar import XGrammarMatcher

        self.count, self.seconds = 0, 0.0
        fork = XGrammarMatcher.fork

        def counted(matcher):
            start = time.perf_counter()
            try:
                return fork(matcher)
            finally:
                self.count, self.seconds = self.count + 1, self.seconds + time.perf_counter() - start

        XGrammarMatcher.fork = counted


FORKS = Forks()


def engine_config(args: argparse.Namespace) -> dict:
    # sequential rounds: a look-ahead's drafts are not counted as proposed (served: no drafting ahead)
    overrides = {"speculation": {"proposer": "draft", "gamma": args.gamma, "overlap": False},
                 "load_monitor": {"enabled": False}}
    if args.profile:
        overrides["models"] = {"target": f"emulated:{args.profile}:target", "draft": f"emulated:{args.profile}:draft"}
        overrides["cache"] = {"max_seq_len": 1024}
    return overrides


def serve_worker(role: str, overrides: str) -> None:
    """`--worker ROLE`: serve the pair's draft or target worker on 127.0.0.1; print its
    address, stop when stdin closes."""
    from specdec.verifiers.target_verifier import TargetVerifier
    from specdec.wiring.engine_builder import load_runner
    from specdec_rpc.worker.draft_servicer import DraftServicer
    from specdec_rpc.worker.target_servicer import TargetServicer
    from specdec_rpc.worker.worker_server import ServerThread

    torch.set_num_threads(1)
    config = load_config(overrides=json.loads(overrides))
    if role == "draft":
        servicer = DraftServicer.from_config(config)
    else:
        runner = load_runner(config.models.target, config.models, config.cache)
        servicer = TargetServicer(TargetVerifier(runner), config.models.target, config.cache.num_slots)
    server = ServerThread(servicer)
    print(server.address, flush=True)
    sys.stdin.read()
    server.stop()


@contextlib.contextmanager
def served_engine(overrides: dict) -> Iterator:
    """The router's engine over a draft and a target worker, each in a process of its own."""
    from specdec_rpc.worker.remote_proposer import RemoteProposer
    from specdec_rpc.worker.remote_verifier import RemoteVerifier

    command = [sys.executable, __file__, "--overrides", json.dumps(overrides), "--worker"]
    workers = {role: subprocess.Popen([*command, role], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for role in ("draft", "target")}
    clients = []
    try:
        address = {role: worker.stdout.readline().strip() for role, worker in workers.items()}
        clients = [RemoteVerifier(address["target"]), RemoteProposer(address["draft"])]
        yield build_engine(load_config(overrides=overrides), *clients)
    finally:
        for client in clients:
            client.close()
        for worker in workers.values():
            worker.stdin.close()
            worker.wait(30)


def run_pass(engine, prompts: list[list[int]], grammar: GrammarSpec | None, args) -> dict:
    """Each prompt once, one at a time: tokens, seconds, proposed, drafted (verified),
    accepted, rounds, outputs."""
    before, proposed, forks = engine.stats.to_dict(), engine.proposer.proposed, (FORKS.count, FORKS.seconds)
    sampling = SamplingParams(temperature=args.temperature, seed=7 if args.temperature else None)
    start, tokens, outputs = time.perf_counter(), 0, []
    for prompt in prompts:
        [r] = engine.generate([GenerationRequest(prompt, args.max_new_tokens, sampling, grammar=grammar)])
        tokens += len(r.token_ids)
        outputs.append(r.token_ids)
    seconds = time.perf_counter() - start
    after = engine.stats.to_dict()
    return {"tokens": tokens, "seconds": seconds, "outputs": outputs, "proposed": engine.proposer.proposed - proposed,
            "forks": FORKS.count - forks[0], "fork_s": FORKS.seconds - forks[1],
            **{k: after[k] - before[k] for k in ("drafted", "accepted", "rounds")}}


def rate(run: dict) -> float:
    return run["tokens"] / run["seconds"]


def summary(passes: list[dict]) -> dict:
    proposed, drafted, accepted, rounds, forks, fork_s = (sum(p[k] for p in passes) for k in (
        "proposed", "drafted", "accepted", "rounds", "forks", "fork_s"))
    return {"alpha": accepted / max(proposed, 1), "alpha_verified": accepted / max(drafted, 1),
            "forks_per_round": forks / max(rounds, 1), "fork_us_per_round": fork_s * 1e6 / max(rounds, 1),
            "accepted_length": (accepted + rounds) / max(rounds, 1),
            "tokens_per_s": statistics.median(rate(p) for p in passes)}


def measure(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Every arm's passes, interleaved: free text, then the schema unmasked and masked."""
    if not args.served:
        return measure_on(build_engine(load_config(overrides=engine_config(args))), args)
    with served_engine(engine_config(args)) as built:
        remote = built.engine.proposer
        arms = measure_on(built, args)
        arms["draft failures"] = remote.failures
        return arms


def measure_on(built, args: argparse.Namespace) -> dict[str, list[dict]]:
    engine, proposer = built.engine, built.engine.proposer
    prompts = [built.encode(p) for p in bundled_prompts()[: args.prompts]]
    schema = GrammarSpec("json_schema", json.dumps(SCHEMA))
    engine.proposer = Arm(proposer, masking=True)
    run_pass(engine, prompts[:1], schema, args)  # warm-up (compiles the schema)
    arms: dict[str, list[dict]] = {"free text": [], "unmasked": [], "masked": []}
    for _ in range(args.passes):
        for arm, passes in arms.items():
            engine.proposer = Arm(proposer, masking=arm == "masked")
            passes.append(run_pass(engine, prompts, None if arm == "free text" else schema, args))
    return arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; else seeded sampling")
    ap.add_argument("--profile", default=None, help="emulated devices of this profile (configs/devices/)")
    ap.add_argument("--served", action="store_true", help="draft and target as gRPC workers (own processes)")
    ap.add_argument("--worker", choices=("draft", "target"), help=argparse.SUPPRESS)
    ap.add_argument("--overrides", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return serve_worker(args.worker, args.overrides)
    torch.set_num_threads(1 if args.profile else max(1, torch.get_num_threads()))
    arms = measure(args)
    failures = arms.pop("draft failures", None)
    same = all(a["outputs"] == b["outputs"] for a, b in zip(arms["unmasked"], arms["masked"]))
    ratios = [rate(m) / rate(u) for m, u in zip(arms["masked"], arms["unmasked"])]
    print(f"\n{args.prompts} prompts x <= {args.max_new_tokens} new tokens, γ {args.gamma}, temperature "
          f"{args.temperature}, {args.profile or 'bundled pair'}, {'served' if args.served else 'in-process'}, "
          f"{args.passes} interleaved passes; outputs masked == unmasked: {same}"
          + ("" if failures is None else f"; draft calls that failed or missed their deadline: {failures}") + "\n")
    print("| draft | α (accepted / proposed) | α (accepted / verified) | mean accepted length | tokens/s "
          "| forks / round | fork µs / round |")
    print("|---|---|---|---|---|---|---|")
    for arm, passes in arms.items():
        s = summary(passes)
        label = arm if arm == "free text" else f"{arm}, JSON schema"
        print(f"| {label} | {s['alpha']:.3f} | {s['alpha_verified']:.3f} | {s['accepted_length']:.2f} "
              f"| {s['tokens_per_s']:.1f} | {s['forks_per_round']:.2f} | {s['fork_us_per_round']:.1f} |")
    print(f"\nmasked / unmasked tokens/s per pass: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
