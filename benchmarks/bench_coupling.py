"""Acceptance of the coupled (drafter-invariant) rule against the standard rule, bundled pair.

A seeded sampled request is verified by the coupled rule (specdec.sampling.gumbel_sampling: the
draft and the target take Gumbel-max choices under shared noise, a draft is accepted iff
both agree); an unseeded one by the standard rule (Leviathan et al.: accept with
probability min(1, p/q)). The coupled rule buys output that does not depend on what was
drafted, at some acceptance: two choices under shared noise agree less often than the
standard rule accepts (at most sum min(p, q); Daliri, Musco and Suresh 2024 bound the
disagreement by 2 TV / (1 + TV)).

Workload, per temperature: `--requests` sampled requests on the bundled held-out prompts
(cut to 64 tokens), `--max-new-tokens` each (EOS ignored), one batch, draft speculation at a
fixed γ. Rows: the standard rule (unseeded requests, torch's global RNG seeded for
repeatability) and the coupled rule (seeds 0 .. requests - 1). Columns: α (accepted /
drafted), mean accepted length (tokens per round, incl. the bonus), and, for the coupled
rule, how many requests gave exactly the text they give with speculation off. Usage:
    python benchmarks/bench_coupling.py [--requests 40] [--max-new-tokens 48] [--gamma 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.config.config import load_config
from specdec.wiring.engine_builder import BuiltEngine, build_engine
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

TEMPERATURES = (1.0, 0.7)


def run(built: BuiltEngine, prompts: list[list[int]], args: argparse.Namespace, temperature: float,
        seeded: bool, mode: str) -> tuple[list[list[int]], dict]:
    """One batch of requests; returns their tokens and the batch's acceptance figures."""
    torch.manual_seed(1234)  # the standard rule's fresh seeds, repeatable
    requests = [GenerationRequest(prompts[i % len(prompts)], args.max_new_tokens,
                                  SamplingParams(temperature=temperature, seed=i if seeded else None),
                                  ignore_eos=True, mode=mode)
                for i in range(args.requests)]
    results = built.engine.generate(requests)
    drafted = sum(r.stats.drafted for r in results)
    accepted = sum(r.stats.accepted for r in results)
    rounds = sum(r.stats.rounds for r in results)
    figures = {"alpha": accepted / drafted if drafted else 0.0, "drafted": drafted,
               "mean_accepted_length": (accepted + rounds) / rounds if rounds else 0.0}
    return [r.token_ids for r in results], figures


def measure(args: argparse.Namespace) -> list[dict]:
    overrides = {"speculation": {"proposer": "draft", "gamma": args.gamma}, "cache": {"num_slots": args.requests},
                 "load_monitor": {"enabled": False}}
    built = build_engine(load_config(overrides=overrides))
    prompts = [built.encode(p)[:64] for p in bundled_prompts()]
    rows = []
    for temperature in TEMPERATURES:
        _, standard = run(built, prompts, args, temperature, seeded=False, mode="on")
        off, _ = run(built, prompts, args, temperature, seeded=True, mode="off")
        on, coupled = run(built, prompts, args, temperature, seeded=True, mode="on")
        same = sum(a == b for a, b in zip(on, off))
        rows.append({"temperature": temperature, "standard": standard, "coupled": coupled,
                     "ratio": coupled["alpha"] / standard["alpha"], "same_as_off": same})
    return rows


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"\n{args.requests} requests x {args.max_new_tokens} new tokens, draft speculation at γ {args.gamma}, "
          f"{torch.get_num_threads()} threads\n")
    print("| temperature | α standard | α coupled | coupled / standard | mean accepted length standard | "
          "mean accepted length coupled | coupled text = speculation-off text |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        s, c = r["standard"], r["coupled"]
        print(f"| {r['temperature']} | {s['alpha']:.3f} | {c['alpha']:.3f} | {r['ratio']:.2f} | "
              f"{s['mean_accepted_length']:.2f} | {c['mean_accepted_length']:.2f} | "
              f"{r['same_as_off']} / {args.requests} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    rows = measure(args)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
