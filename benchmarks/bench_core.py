"""Single-stream speculative decoding benchmark on the bundled pair (prints a Markdown table).

Workload: greedy, 128 new tokens (EOS ignored so every run does the same work) for each of
a fixed set of held-out code prompts, one request at a time. Rows: target-only decoding,
draft-model speculation and n-gram speculation at fixed γ ∈ {1, 2, 4, 6, 8} and with the
goodput policy choosing γ each round (the default of `specdec generate`; γ column "auto"),
and transformers' own assisted generation (`generate(assistant_model=draft)`) on the same
pair as a peer.

Columns: tokens/s; α (acceptance rate); mean accepted length (tokens per round, incl. the
bonus); c = draft step time / target step time (measured here, 0 for n-gram); the
theoretical speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the measured speedup over
target-only in this same run; and measured / theoretical.

Each configuration runs `--repeats` passes and keeps the fastest (α is deterministic under
greedy decoding; only the timing varies). Usage:
    python benchmarks/bench_core.py [--prompts 8] [--max-new-tokens 128] [--repeats 2] [--json out.json]

With `--profile NAME` (configs/devices/NAME.yaml) the same engine runs on emulated devices
instead: speculation OFF vs ON at 1, 8 and 32 streams beside the standard prediction
(benchmarks/emulated_core.py):
    python benchmarks/bench_core.py --profile h100-llama-8b-1b [--streams 1,8,32] [--gammas 2,4,6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import emulated_core
from progress import Progress
from specdec.config.config import load_config
from specdec.wiring.engine_builder import BuiltEngine, build_engine
from specdec.models.model_paths import bundled_prompts, resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.requests.request import GenerationRequest

GAMMAS = (1, 2, 4, 6, 8)
FIXED = {"enabled": False}  # load_monitor overrides without a policy: every round uses speculation.gamma


def theoretical_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected speedup of Leviathan et al. (i.i.d. acceptance α, draft/target cost ratio c)."""
    if gamma == 0:
        return 1.0
    tokens = gamma + 1 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + 1)


def step_time(runner: ModelRunner, context: list[int], new_tokens: int, repeats: int = 30) -> float:
    """Median seconds of one forward of `new_tokens` tokens after `context` (cache rolled back each time)."""
    slot = runner.allocate_slot()
    runner.forward([slot], [context])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.forward([slot], [context[:new_tokens]])
        times.append(time.perf_counter() - start)
        runner.truncate(slot, len(context))
    runner.free_slot(slot)
    return statistics.median(times)


def run_engine(built: BuiltEngine, prompts: list[list[int]], max_new: int, repeats: int) -> dict:
    """Best tokens/s of `repeats` passes over the prompts (greedy: α is the same every pass)."""
    engine = built.engine
    engine.generate([GenerationRequest(prompts[0], 8, ignore_eos=True)])  # warm-up
    stats_before = engine.stats.to_dict()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = 0
        for prompt in prompts:
            [r] = engine.generate([GenerationRequest(prompt, max_new, ignore_eos=True)])
            tokens += len(r.token_ids)
        best = max(best, tokens / (time.perf_counter() - start))
    s = engine.stats
    drafted = s.drafted - stats_before["drafted"]
    accepted = s.accepted - stats_before["accepted"]
    rounds = s.rounds - stats_before["rounds"]
    return {
        "tokens_per_s": best,
        "alpha": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": (accepted + rounds) / rounds,
    }


def run_hf(prompts: list[list[int]], max_new: int, assistant: bool, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(resolve_model_path("bundled:target"), dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(resolve_model_path("bundled:draft"), dtype=torch.float32)
    kwargs = {"assistant_model": draft} if assistant else {}

    def gen(prompt: list[int], n: int) -> int:
        ids = torch.tensor([prompt])
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                              min_new_tokens=n, pad_token_id=0, **kwargs)
        return out.shape[1] - len(prompt)

    gen(prompts[0], 8)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = sum(gen(p, max_new) for p in prompts)
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _num(x: float) -> str:
    return "–" if x != x else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="passes per configuration; the best is kept")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--profile", default=None, help="run on emulated devices of this profile (configs/devices/)")
    ap.add_argument("--streams", type=_ints, default=(1, 8, 32),
                    help="with --profile: concurrent requests, e.g. 1,8,32")
    ap.add_argument("--gammas", type=_ints, default=(2, 4, 6), help="with --profile: fixed γ values of the ON rows")
    ap.add_argument("--time-scale", type=float, default=1.0, help="with --profile: multiplies every device time")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.profile:
        rows = emulated_core.measure(args, theoretical_speedup)
        emulated_core.print_table(rows, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"profile": args.profile, "time_scale": args.time_scale, "rows": rows}, f, indent=2)
        return

    base = build_engine(load_config(overrides={"speculation": {"proposer": "none", "gamma": 0}, "load_monitor": FIXED}))
    prompts = [base.encode(p) for p in bundled_prompts()[: args.prompts]]
    draft_runner = ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=1, max_seq_len=512)
    ctx = prompts[0]
    t_target = step_time(base.engine.verifier.runner, ctx, 1)
    c = step_time(draft_runner, ctx, 1) / t_target
    verify = {g: step_time(base.engine.verifier.runner, ctx, g + 1) / t_target for g in (4, 8)}
    rows = measure(base, prompts, args, c)
    hf_plain = run_hf(prompts, args.max_new_tokens, assistant=False, repeats=args.repeats)
    hf_assisted = run_hf(prompts, args.max_new_tokens, assistant=True, repeats=args.repeats)

    print(f"\n{len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy, single stream, "
          f"{torch.get_num_threads()} threads; target step {t_target * 1e3:.2f} ms, c = {c:.3f}, "
          f"verify 5 tokens = {verify[4]:.2f}x one token, 9 tokens = {verify[8]:.2f}x\n")
    print_table(rows, hf_plain, hf_assisted)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "hf_target_only": hf_plain, "hf_assisted": hf_assisted, "c": c,
                       "verify_cost": verify}, f, indent=2)


def measure(base, prompts: list[list[int]], args: argparse.Namespace, c: float) -> list[dict]:
    """Target only, then every proposer at every fixed γ and the goodput policy ("auto"),
    each with its speedup over target only and the closed form's prediction."""
    rows = []
    with Progress(1 + 2 * (len(GAMMAS) + 1), "bench_core") as progress:
        progress.step("target only")
        baseline = run_engine(base, prompts, args.max_new_tokens, args.repeats)
        rows.append({"method": "target only", "gamma": 0, **baseline, "c": 0.0})
        for proposer in ("draft", "ngram"):
            for gamma in (*GAMMAS, "auto"):
                progress.step(f"{proposer}, γ {gamma}")
                overrides = {"speculation": {"proposer": proposer, "gamma": 4 if gamma == "auto" else gamma},
                             "load_monitor": {} if gamma == "auto" else FIXED}
                built = build_engine(load_config(overrides=overrides))
                r = run_engine(built, prompts, args.max_new_tokens, args.repeats)
                rows.append({"method": f"{proposer} speculation", "gamma": gamma, **r,
                             "c": c if proposer == "draft" else 0.0})
    for row in rows:
        auto = row["gamma"] == "auto"  # the policy's γ varies: no closed form
        row["theoretical"] = float("nan") if auto else theoretical_speedup(row["alpha"], row["gamma"], row["c"])
        row["speedup"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        row["ratio"] = row["speedup"] / row["theoretical"]
    return rows


def print_table(rows: list[dict], hf_plain: float, hf_assisted: float) -> None:
    baseline = rows[0]["tokens_per_s"]  # target only
    print("| method | γ | tokens/s | α | mean accepted length | c | theoretical speedup | measured speedup "
          "| measured / theoretical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['gamma']} | {r['tokens_per_s']:.1f} | {r['alpha']:.3f} | "
              f"{r['mean_accepted_length']:.2f} | {r['c']:.3f} | {_num(r['theoretical'])} | {r['speedup']:.2f} "
              f"| {_num(r['ratio'])} |")
    print(f"| transformers generate (target only) | 0 | {hf_plain:.1f} | | | | | {hf_plain / baseline:.2f} | |")
    print(f"| transformers generate(assistant_model=draft) | dyn. | {hf_assisted:.1f} | | | | | "
          f"{hf_assisted / baseline:.2f} | |")


if __name__ == "__main__":
    main()
