"""Where AUTO's rows wait beyond ON's: rounds split by their kind, in-process on emulated devices.

The in-process engine (production engine, proposer, planner and goodput policy; emulated
devices, no Ray) plays one seeded open-loop Poisson schedule once per policy (ON at γ 4,
AUTO under the TPOT target), requests sampled at temperature 1. Every round is recorded:

* its kind, from the γ its decoding rows were planned (rows reading their prompt, or a
  prefill chunk, left out): "plain" (every row γ 0), "uniform" (every row one γ > 0) or
  "mixed" (rows at different γ, some of them maybe 0);
* its rows' γ, the proposer's catch-up (history tokens read before drafting) and the
  proposer call's seconds, its wall seconds;
* per row that emitted and had emitted before: the seconds it waited since and its tokens.

Then per policy and kind: rounds, share of the row-waits, mean wall ms, ms a row waited
per token, catch-up tokens and proposer ms per round, and the requests' TPOT p50 / p90 and
attainment. AUTO's rows at the same γ as ON's (the mixed rounds' rows by their own γ) show
what a mixed round or a row's catch-up costs beyond the γ the plan chose.

Each priced round of a full batch is also set against the cost model that priced it
(`round_prices.py`): verify, draft and the rest measured against their predictions from the
round's own shape, measured / predicted of the whole round, and its tokens against the plan's
(`--modes` may add "off": plain decoding's rounds priced alike).

`--draft-ahead` runs it as served: the target verifies on a thread of its own
(`emulated_ahead.ConcurrentVerifier`) and the engine drafts ahead (each kind of step measures
its ways, or `--way` fixes one); each run then also prints its steps by way. Every goodput
plan's candidates (draft steps, rows within their targets, tokens/s) go to `--json`.

    cd benchmarks && PYTHONPATH=..:. python round_kinds.py --time-scale 8 --qps 10 --duration 24 [--draft-ahead]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from round_prices import PRICED, price_rows, print_prices, record_prices
from specdec.config.config import load_config
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest
from specdec.requests.speculation_mode import SpeculationMode
from specdec.sampling.sampling import SamplingParams
from specdec.wiring.engine_builder import build_engine


def auto_engine(args: argparse.Namespace):
    """The in-process engine on the emulated pair, under the goodput policy (as the server's)."""
    built = build_engine(load_config(overrides={
        "models": {"target": f"emulated:{args.profile}:target", "draft": f"emulated:{args.profile}:draft",
                   "device_time_scale": args.time_scale},
        "cache": {"num_slots": args.slots, "max_seq_len": 1024},
        "speculation": {"proposer": "draft", "gamma": 4},
        "load_monitor": {"enabled": True, "redis_url": "", "window_s": 4.0, "bucket_s": 1.0, "stale_after_s": 4.0,
                         "min_dwell_s": 1.0, "tpot_target_ms": args.tpot_target_ms},
    }))
    if args.draft_ahead:  # as served: the target verifies on its own thread while the draft works
        from emulated_ahead import ConcurrentVerifier
        from specdec.round.draft_ahead import DraftAhead

        built.engine.verifier = ConcurrentVerifier(built.engine.verifier)
        built.engine.draft_ahead = DraftAhead(way=args.way)
    monitor = built.engine.policy
    if hasattr(monitor, "start"):
        monitor.start()
    return built


def kind_of(gammas: list[int]) -> str:
    if not gammas:
        return "none"
    if max(gammas) == 0:
        return "plain"
    return "uniform" if min(gammas) == max(gammas) else "mixed"


CANDIDATES: list[list[tuple[int, int, float]]] = []  # per plan: (draft steps, rows within target, tokens/s)


def record_candidates() -> None:
    """Keep every goodput plan's candidates (`gamma._candidates`), to see why a plan chose its steps."""
    from specdec.policy import gamma

    original = gamma._candidates

    def candidates(*a, **k):
        out = original(*a, **k)
        CANDIDATES.append([(max(c.reach), c.met, c.value) for c in out])
        return out
    gamma._candidates = candidates


class Recorder:
    """Wraps the engine's step and proposer calls; keeps per round and per row what they took."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.rounds: list[dict] = []
        self.waits: list[tuple[str, int, float, int]] = []  # (round kind, row γ, seconds waited, tokens)
        self.last_emit: dict[str, float] = {}
        self.emits: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self._propose_s = 0.0
        self.idle_rows: list[tuple[int, int]] = []  # rows the plan left at γ 0 though they could draft: (catch-up, cap)
        self.drafting_catch_up: list[int] = []  # catch-up of rows that draft, per row
        planner = engine.planner
        original_plan = planner.plan

        def plan(batch, policy, max_seq_len, load):
            original_plan(batch, policy, max_seq_len, load)
            for seq in batch:
                row = planner.row_state(seq, max_seq_len)
                gamma = planner.gamma_for(seq)
                if gamma == 0 and row.cap > 0 and seq.stats.rounds > 0:
                    self.idle_rows.append((row.catch_up_tokens, row.cap))
                elif gamma > 0 and seq.stats.rounds > 0:
                    self.drafting_catch_up.append(row.catch_up_tokens)
        planner.plan = plan
        self.sample = None
        monitor = engine.policy
        original_record = monitor.record

        def record(sample):
            self.sample = sample
            original_record(sample)
        monitor.record = record
        proposals = engine.proposals
        for name in ("propose", "ready_drafts"):
            original = getattr(proposals, name)
            setattr(proposals, name, self._timed(original))

    def _timed(self, call):
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return call(*a, **k)
            finally:
                self._propose_s += time.perf_counter() - started
        return wrapper

    def _priced(self, decision) -> dict | None:
        """The round's measured parts beside its cost model's predictions of them (None: not a
        priced plan's whole batch): verify, draft and the rest, seconds, from the round's own
        shape; the plan's tokens/s from its reason."""
        sample, cost = self.sample, PRICED.get(decision.planned_s)
        if sample is None or cost is None or sample.planned_seconds <= 0:
            return None
        shape = sample.shape
        verify = cost.verify_s(shape.rows, shape.drafted, shape.prompt_tokens)
        draft = cost.draft_s(shape.draft_rows, shape.steps, shape.catch_up)
        drafting = shape.steps > 0 or shape.drafted > 0
        numbers = re.search(r"goodput plan: (\d+) vs (\d+)", decision.reason)
        return {"drafting": drafting, "steps": shape.steps, "rows": shape.rows, "draft_rows": shape.draft_rows,
                "catch_up": shape.catch_up, "prompt_tokens": shape.prompt_tokens,
                "verify_s": sample.verify_seconds, "draft_s": sample.draft_seconds, "round_s": sample.round_seconds,
                "verify_pred": verify, "draft_pred": draft, "overhead_pred": cost.overhead_s,
                "planned_s": sample.planned_seconds,
                "scale": cost.drafting_scale if drafting else cost.plain_scale,
                "goodput": float(numbers.group(1)) if numbers else 0.0,
                "plain_goodput": float(numbers.group(2)) if numbers else 0.0,
                "decode_s": decision.decode_s, "coefficients": (cost.verify, cost.draft)}

    def step(self) -> None:
        engine = self.engine
        self._propose_s = 0.0
        self.sample = None
        started = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        planner = engine.planner
        planned = dict(planner._planned)
        fresh = {sid for sid, seq in ((s.seq_id, s) for s in engine.scheduler.running) if seq.stats.rounds <= 1}
        decoding = [g for sid, g in planned.items() if sid in self.last_emit]
        kind = kind_of(decoding)
        self.rounds.append({"kind": kind, "gammas": sorted(planned.values()), "rows": len(planned),
                            "decoding": len(decoding), "catch_up": engine._proposer_view.read,
                            "propose_s": self._propose_s, "wall_s": now - started, "fresh": len(fresh),
                            "reason": planner.decision.reason,
                            "way": engine.draft_ahead._step[0] if engine.draft_ahead else "sequential",
                            "emitted": sum(len(o.new_token_ids) for o in outputs),
                            "priced": self._priced(planner.decision)})
        for out in outputs:
            tokens = len(out.new_token_ids)
            if not tokens:
                continue
            last = self.last_emit.get(out.seq_id)
            if last is not None:
                self.waits.append((kind, planned.get(out.seq_id, 0), now - last, tokens))
            self.last_emit[out.seq_id] = now
            self.emits[out.seq_id].append((now, tokens))


def play(built, args: argparse.Namespace, prompts: list[list[int]], mode: str, schedule) -> Recorder:
    """One run of the schedule under `mode` ("on" / "off" / "auto"): warm-up arrivals, then measured ones."""
    engine = built.engine
    recorder = Recorder(engine)
    sm = {"on": SpeculationMode.ON, "off": SpeculationMode.OFF}.get(mode, SpeculationMode.AUTO)
    start = time.perf_counter()
    pending = list(schedule)
    measured: set[str] = set()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            at, prompt, seed = pending.pop(0)
            seq_id = engine.add_request(GenerationRequest(
                tuple(prompt), args.max_new_tokens, SamplingParams(temperature=1.0, seed=seed), ignore_eos=True,
                mode=sm, gamma=4 if mode == "on" else None, tpot_target_ms=args.tpot_target_ms))
            if at >= args.warmup:
                measured.add(seq_id)
        if not engine.has_unfinished():
            time.sleep(min(0.005, max(0.0, pending[0][0] - now)) if pending else 0)
            continue
        recorder.step()
    recorder.measured = measured
    return recorder


def tpots(recorder: Recorder) -> list[float]:
    """Each measured request's TPOT: (last emission - first) / (tokens - first chunk's)."""
    out = []
    for seq_id in recorder.measured:
        emits = recorder.emits.get(seq_id, [])
        tokens = sum(t for _, t in emits[1:])
        if tokens:
            out.append((emits[-1][0] - emits[0][0]) / tokens)
    return out


def summary(mode: str, recorder: Recorder, target_s: float) -> dict:
    """Per kind of round: rounds, wall ms, catch-up, proposer ms; per row γ: ms waited per token."""
    by_kind: dict[str, dict] = {}
    for kind in ("plain", "uniform", "mixed"):
        rounds = [r for r in recorder.rounds if r["kind"] == kind]
        waits = [w for w in recorder.waits if w[0] == kind]
        if not rounds:
            continue
        by_kind[kind] = {
            "rounds": len(rounds), "rows": float(np.mean([r["rows"] for r in rounds])),
            "wall_ms": 1000 * float(np.mean([r["wall_s"] for r in rounds])),
            "propose_ms": 1000 * float(np.mean([r["propose_s"] for r in rounds])),
            "catch_up": float(np.mean([r["catch_up"] for r in rounds])),
            "max_gamma": float(np.mean([max(r["gammas"]) for r in rounds])),
            "zero_rows": float(np.mean([sum(g == 0 for g in r["gammas"]) for r in rounds])),
            "row_waits": len(waits),
            "wait_ms_per_token": 1000 * sum(w[2] for w in waits) / max(1, sum(w[3] for w in waits)),
        }
    per_gamma: dict[str, dict] = {}
    for kind in ("uniform", "mixed", "plain"):
        for g in sorted({w[1] for w in recorder.waits if w[0] == kind}):
            waits = [w for w in recorder.waits if w[0] == kind and w[1] == g]
            per_gamma[f"{kind} γ{g}"] = {"row_waits": len(waits),
                                         "wait_ms": 1000 * float(np.mean([w[2] for w in waits])),
                                         "tokens": float(np.mean([w[3] for w in waits])),
                                         "ms_per_token": 1000 * sum(w[2] for w in waits) / sum(w[3] for w in waits)}
    by_steps: dict[str, dict] = {}
    full = [r for r in recorder.rounds if r["rows"] >= 24 and r["kind"] != "plain"]
    for steps in sorted({max(r["gammas"]) for r in full}):
        rounds = [r for r in full if max(r["gammas"]) == steps]
        by_steps[str(steps)] = {"rounds": len(rounds), "rows": float(np.mean([r["rows"] for r in rounds])),
                                "wall_ms": 1000 * float(np.mean([r["wall_s"] for r in rounds])),
                                "propose_ms": 1000 * float(np.mean([r["propose_s"] for r in rounds])),
                                "catch_up": float(np.mean([r["catch_up"] for r in rounds])),
                                "mixed": float(np.mean([r["kind"] == "mixed" for r in rounds])),
                                "fresh": float(np.mean([r["fresh"] for r in rounds])),
                                "missed": float(np.mean(["missed" in r["reason"] for r in rounds]))}
    by_way: dict[str, dict] = {}
    for way in sorted({r["way"] for r in full}):
        rounds = [r for r in full if r["way"] == way]
        by_way[way] = {"rounds": len(rounds), "wall_ms": 1000 * float(np.mean([r["wall_s"] for r in rounds])),
                       "steps": float(np.mean([max(r["gammas"]) for r in rounds])),
                       "tokens_per_s": sum(r["emitted"] for r in rounds) / sum(r["wall_s"] for r in rounds)}
    t = np.array(tpots(recorder))
    all_gammas = [g for w in recorder.waits for g in [w[1]]]
    idle = recorder.idle_rows
    print(f"{mode}: rows left at γ 0 though they could draft: {len(idle)} row-rounds, mean catch-up "
          f"{np.mean([c for c, _ in idle]) if idle else 0:.1f} tokens; drafting rows' catch-up "
          f"{np.mean(recorder.drafting_catch_up) if recorder.drafting_catch_up else 0:.1f}")
    return {"mode": mode, "kinds": by_kind, "per_gamma": per_gamma, "by_steps": by_steps, "by_way": by_way,
            "tpot_p50_ms": 1000 * float(np.median(t)) if len(t) else 0.0,
            "tpot_p90_ms": 1000 * float(np.percentile(t, 90)) if len(t) else 0.0,
            "attainment": float(np.mean(t <= target_s)) if len(t) else 0.0, "requests": len(t),
            "mean_row_gamma": float(np.mean(all_gammas)) if all_gammas else 0.0,
            "reasons": [r["reason"] for r in recorder.rounds[:: max(1, len(recorder.rounds) // 6)]]}


def print_summary(s: dict) -> None:
    print(f"\n{s['mode'].upper()}: {s['requests']} requests, TPOT p50 {s['tpot_p50_ms']:.1f} ms, "
          f"p90 {s['tpot_p90_ms']:.1f}, attainment {100 * s['attainment']:.0f}%, row γ mean {s['mean_row_gamma']:.2f}")
    print("| kind | rounds | rows | max γ | rows at γ 0 | wall ms | proposer ms | catch-up tokens | row-waits | "
          "ms waited per token |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, k in s["kinds"].items():
        print(f"| {kind} | {k['rounds']} | {k['rows']:.1f} | {k['max_gamma']:.2f} | {k['zero_rows']:.1f} | "
              f"{k['wall_ms']:.1f} | {k['propose_ms']:.1f} | {k['catch_up']:.1f} | {k['row_waits']} | "
              f"{k['wait_ms_per_token']:.1f} |")
    print("| rows by round kind and own γ | row-waits | ms per wait | tokens per wait | ms per token |")
    print("|---|---:|---:|---:|---:|")
    for name, g in s["per_gamma"].items():
        print(f"| {name} | {g['row_waits']} | {g['wait_ms']:.1f} | {g['tokens']:.2f} | {g['ms_per_token']:.1f} |")
    print("| draft steps (rounds of ≥ 24 rows) | rounds | rows | wall ms | proposer ms | catch-up tokens | "
          "mixed | rows in their first rounds | plans where no plan met every target |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for steps, b in s["by_steps"].items():
        print(f"| {steps} | {b['rounds']} | {b['rows']:.1f} | {b['wall_ms']:.1f} | {b['propose_ms']:.1f} | "
              f"{b['catch_up']:.1f} | {100 * b['mixed']:.0f}% | {b['fresh']:.1f} | "
              f"{100 * b['missed']:.0f}% |")


def print_ways(s: dict) -> None:
    print("| way (rounds of ≥ 24 rows) | rounds | draft steps | wall ms | emitted tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for way, w in s["by_way"].items():
        print(f"| {way} | {w['rounds']} | {w['steps']:.2f} | {w['wall_ms']:.1f} | {w['tokens_per_s']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="h100-llama-8b-1b")
    parser.add_argument("--time-scale", type=float, default=8.0)
    parser.add_argument("--qps", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals, warm-up included")
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--tpot-target-ms", type=float, default=75.0)
    parser.add_argument("--modes", nargs="+", default=["on", "auto"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-ahead", action="store_true",
                        help="the target verifies on a thread of its own and the engine drafts ahead, as served")
    parser.add_argument("--way", default=None, choices=("sequential", "look-ahead", "micro-batches"),
                        help="with --draft-ahead: every step this way (default: each kind of step measures its ways)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    built = auto_engine(args)
    texts = bundled_prompts()
    prompts = [built.encode(p) for p in texts]
    schedule, at = [], 0.0
    while True:
        at += rng.expovariate(args.qps)
        if at >= args.duration:
            break
        schedule.append((at, prompts[rng.randrange(len(prompts))], rng.randrange(1 << 30)))
    record_candidates()
    record_prices()
    results = []
    for mode in args.modes:
        CANDIDATES.clear()
        ahead = built.engine.draft_ahead
        before = (dict(ahead.steps_by_way), ahead.rows_ahead, ahead.hits, ahead.plain_rounds) if ahead else None
        recorder = play(built, args, prompts, mode, schedule)
        result = summary(mode, recorder, args.tpot_target_ms / 1000.0)
        print_summary(result)
        print_ways(result)
        result["prices"] = price_rows(recorder.rounds)
        print_prices(result["prices"])
        result["priced_rounds"] = [{k: v for k, v in r["priced"].items() if k != "coefficients"} | {
            "emitted": r["emitted"]} for r in recorder.rounds if r.get("priced")]
        result["coefficients"] = [r["priced"]["coefficients"] for r in recorder.rounds if r.get("priced")][-1:]
        result["candidates"] = CANDIDATES[-400:]
        if ahead:
            ways = {k: v - before[0].get(k, 0) for k, v in ahead.steps_by_way.items()}
            result["ahead"] = {"ways": ways, "rows_ahead": ahead.rows_ahead - before[1], "hits": ahead.hits - before[2],
                               "plain_after_miss": ahead.plain_rounds - before[3]}
            print(f"drafting ahead: steps by way {ways}, look-ahead rows {result['ahead']['rows_ahead']}, "
                  f"hits {result['ahead']['hits']}, rows verified plainly after a miss "
                  f"{result['ahead']['plain_after_miss']}")
        results.append(result)
        time.sleep(2.0)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
