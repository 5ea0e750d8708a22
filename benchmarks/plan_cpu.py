"""The goodput plan's CPU per round, on the round's critical path and off it (planned ahead).

Drives the engine's `RoundPlanner` with the production policy (`LoadMonitor` over a
`SpeculationPolicy`, in-process store) on a batch that lives as a served one does: rows
draft and get drafts accepted at α, finish after --max-new-tokens, and newcomers take the
slots they free (a saturated server; or --arrivals per round). Between two plans the
"engine thread" waits --verify-ms (as it waits for the proposer and the target), which is
when a plan made ahead runs. The
policy's measurements come from rounds timed by the emulated H100 pair's costs at time
scale 8 (as `bench_load.py --profile h100-llama-8b-1b --time-scale 8` fits them), so the
plans are the ones AUTO makes there. Variants, interleaved run by run (A B A B ...):

* in place: the plan is made in the round (the policy offers no plan ahead);
* ahead: each round's plan starts the next one on the planner's worker thread.

Prints, per variant and batch size: the plan's ms per round on the critical path (median
over runs, with the range), the ms per round made ahead, and the share of rounds that took
the plan made ahead. Pure CPU, no server: python benchmarks/plan_cpu.py [--rows 8 32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.policy.load_monitor import LoadMonitor  # noqa: E402
from specdec.policy.load_stats import RoundSample  # noqa: E402
from specdec.policy.round_cost import RoundCostModel  # noqa: E402
from specdec.policy.policy_settings import PolicySettings  # noqa: E402
from specdec.policy.speculation_policy import SpeculationPolicy  # noqa: E402
from specdec.proposers.proposer_view import ProposerView  # noqa: E402
from specdec.requests.request import GenerationRequest  # noqa: E402
from specdec.requests.sequence import Sequence  # noqa: E402
from specdec.requests.stop_conditions import StopChecker  # noqa: E402
from specdec.round.round_planner import RoundPlanner  # noqa: E402

SCALE_8 = RoundCostModel(verify=(0.060, 0.0003, 0.0001, 0.0001, 0.002), draft=(0.004, 0.011, 0.00005, 0.0),
                         overhead_s=0.002)


class InPlace:
    """The monitor without `plan_ahead`: every round plans in place."""

    def __init__(self, monitor: LoadMonitor) -> None:
        self.monitor = monitor

    def set_load(self, running: int, queued: int) -> None:
        self.monitor.set_load(running, queued)

    def plan(self, rows, default_gamma):
        return self.monitor.plan(rows, default_gamma)


def measured_monitor(alpha: float, rng: random.Random) -> LoadMonitor:
    """A monitor whose window holds rounds timed by SCALE_8 at several batches and γ."""
    settings = PolicySettings(gamma_max=8, fallback_gamma=4, stale_after_s=1e9, min_gain=0.05, min_dwell_s=1.0,
                              explore_interval_s=0, tpot_target_s=0.075)
    monitor = LoadMonitor(None, SpeculationPolicy(settings), "bench", window_s=1e6, cost_window_s=1e6)
    for rows in (4, 8, 16, 32):
        for gamma in (0, 1, 2, 3, 4):
            accepted = [sum(1 for _ in iter(lambda: rng.random() < alpha, False)) for _ in range(rows)]
            accepted = [min(a, gamma) for a in accepted]
            verify = SCALE_8.verify_s(rows, rows * gamma)
            draft = SCALE_8.draft_s(rows, gamma)
            for _ in range(4):
                monitor.record(RoundSample.from_rows([gamma] * rows, [gamma] * rows, accepted, draft, verify,
                                                     verify + draft + SCALE_8.overhead_s))
    monitor.tick()
    monitor.policy.update_switch(monitor.snapshot, 32, 0.0)
    return monitor


def new_row(name: str, max_new: int, rng: random.Random) -> Sequence:
    prompt = tuple(rng.randrange(100) for _ in range(rng.randint(20, 80)))
    return Sequence(name, GenerationRequest(prompt_token_ids=prompt, max_new_tokens=max_new), StopChecker(max_new))


def run(rows: int, rounds: int, ahead: bool, args: argparse.Namespace, seed: int) -> dict:
    """One run of `rounds` rounds at about `rows` rows: the planner's time per round."""
    rng = random.Random(seed)
    monitor = measured_monitor(args.alpha, rng)
    policy = monitor if ahead else InPlace(monitor)
    planner, ids = RoundPlanner(4, 16, ProposerView()), iter(range(10**9))
    batch = [new_row(f"r{next(ids)}", args.max_new_tokens, rng) for _ in range(rows)]
    for seq in batch:  # mid-answer: their prompts read, a few rounds drafted
        seq.stats.rounds = 1
        seq.token_ids.extend(rng.randrange(100) for _ in range(rng.randrange(args.max_new_tokens // 2)))
    for _ in range(rounds):
        planner.plan(batch, policy, 4096, (len(batch), 0))
        time.sleep(args.verify_ms / 1000.0)  # the engine thread waits for the draft and the target
        for seq in batch:
            gamma = planner.gamma_for(seq)
            kept = 0
            while kept < gamma and rng.random() < args.alpha:
                kept += 1
            seq.stats.record_round(gamma, kept, gamma)
            seq.token_ids.extend(rng.randrange(100) for _ in range(min(kept + 1, seq.remaining)))
        batch = [seq for seq in batch if seq.remaining > 0]
        if args.arrivals is None:  # saturated: the queue refills every slot that frees
            arrivals = rows - len(batch)
        else:
            arrivals = sum(1 for _ in range(rows) if rng.random() < args.arrivals / rows)
        batch += [new_row(f"r{next(ids)}", args.max_new_tokens, rng) for _ in range(arrivals)]
        batch = batch[: 2 * rows] or [new_row(f"r{next(ids)}", args.max_new_tokens, rng)]
    return planner.planning.per_round_ms()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=300, help="rounds per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per variant (interleaved)")
    parser.add_argument("--verify-ms", type=float, default=5.0, help="what the engine thread waits per round")
    parser.add_argument("--arrivals", type=float, default=None,
                        help="newcomers per round (mean; default: every slot that frees is refilled, rows stay --rows)")
    parser.add_argument("--alpha", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    print("| rows | variant | plan ms per round, critical path (median, range) | made ahead ms per round "
          "| rounds that took the plan made ahead |")
    print("|---:|---|---|---:|---:|")
    for rows in args.rows:
        found: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(args.runs):
            for ahead in (False, True):
                found[ahead].append(run(rows, args.rounds, ahead, args, seed=i))
        for ahead, runs in found.items():
            critical = [r["plan_critical_ms"] for r in runs]
            print(f"| {rows} | {'ahead' if ahead else 'in place'} | {statistics.median(critical):.3f} "
                  f"({min(critical):.3f}–{max(critical):.3f}) | "
                  f"{statistics.median(r['plan_ahead_ms'] for r in runs):.3f} | "
                  f"{statistics.median(r['plan_taken_ahead'] for r in runs):.0%} |", flush=True)


if __name__ == "__main__":
    main()
