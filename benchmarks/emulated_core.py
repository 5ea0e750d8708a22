"""bench_core on emulated devices (`bench_core.py --profile NAME`): the in-process engine on an
emulated target and draft whose forwards take a device profile's times (configs/devices/).

The engine, proposer, sampler and scheduler are the production code; only the devices are
emulated (they wait, costing no CPU), so this shows what speculation gains on the profiled
hardware, not on this CPU. Workload: greedy, `--max-new-tokens` per request, N requests
decoded together for each N of `--streams`; speculation OFF (plain decoding) and ON at each
fixed γ of `--gammas` with the draft model.

Columns: tokens/s; α₁ = acceptance of the first drafted token (the per-token α of the
closed form); mean accepted length (tokens per round, incl. the bonus); c = the profile's
draft step time / target step time at that batch; the standard prediction
(1 − α^(γ+1)) / ((1 − α)(γc + 1)) for the profile's α; the measured speedup over OFF;
measured / predicted; the framework's time per round = wall time minus the emulated device
time on the round's critical path (draft steps then the target's verify, in-process) minus
"late": how much later than their device time the forwards returned (the host work of an
emulated forward beyond its device time, and the wake-up delays of a busy CPU scheduler).
Torch runs one intra-op thread here: the host's tensors are small, and on a shared CPU a
parallel region waits for descheduled threads (docs/emulated_devices.md gives the measurement).
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.config.config import load_config
from specdec.wiring.engine_builder import BuiltEngine, build_engine
from specdec.models.model_paths import bundled_prompts
from specdec.models.emulated_profile import load_profile
from specdec.requests.request import GenerationRequest


def emulated_engine(profile: str, gamma: int, time_scale: float, slots: int) -> BuiltEngine:
    """The in-process engine on `profile`'s emulated pair, at a fixed γ (no policy)."""
    return build_engine(load_config(overrides={
        "models": {"target": f"emulated:{profile}:target", "draft": f"emulated:{profile}:draft",
                   "device_time_scale": time_scale},
        "cache": {"num_slots": slots, "max_seq_len": 1024},
        "speculation": {"proposer": "draft" if gamma else "none", "gamma": gamma},
        "load_monitor": {"enabled": False},
    }))


def devices(built: BuiltEngine) -> list:
    """The emulated devices of the engine's target and (if loaded) draft."""
    found = [built.engine.verifier.runner.model.emulated_device]
    for proposer in getattr(built.engine.proposer, "proposers", {}).values():
        runner = getattr(proposer, "runner", None)
        if runner is not None:
            found.append(runner.model.emulated_device)
    return found


def run(built: BuiltEngine, prompts: list[list[int]], streams: int, max_new: int) -> dict:
    """Decode `streams` requests together once; tokens/s, α₁, accepted length (per request's
    round), framework ms per engine round (all requests' rounds of one step)."""
    engine = built.engine
    engine.generate([GenerationRequest(prompts[0], 4)])  # warm-up
    before = engine.stats.to_dict()
    busy, late = sum(d.busy_s for d in devices(built)), sum(d.late_s for d in devices(built))
    first = (engine.stats.accepted_per_position[:1] or [0])[0], (engine.stats.drafted_per_position[:1] or [0])[0]
    ids = [engine.add_request(GenerationRequest(prompts[i % len(prompts)], max_new)) for i in range(streams)]
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished():
        engine.step()  # one round of every running request
        steps += 1
    wall = time.perf_counter() - start
    results = [engine.result(i) for i in ids]
    device_s = sum(d.busy_s for d in devices(built)) - busy
    late_s = sum(d.late_s for d in devices(built)) - late  # host work past the device time, wake-up delays
    s = engine.stats
    rounds = s.rounds - before["rounds"]
    accepted, drafted = s.accepted - before["accepted"], s.drafted - before["drafted"]
    first_drafted = (s.drafted_per_position[:1] or [0])[0] - first[1]
    first_accepted = (s.accepted_per_position[:1] or [0])[0] - first[0]
    return {"tokens_per_s": sum(len(r.token_ids) for r in results) / wall,
            "alpha_1": first_accepted / first_drafted if first_drafted else 0.0,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_length": (accepted + rounds) / rounds if rounds else 0.0,
            "framework_ms_per_round": (wall - device_s - late_s) / steps * 1000 if steps else 0.0,
            "late_ms_per_round": late_s / steps * 1000 if steps else 0.0}


def measure(args: argparse.Namespace, predict) -> list[dict]:
    """OFF and ON at each γ, for each stream count: the rows of the table."""
    torch.set_num_threads(1)  # host work is small tensors: intra-op threads only add synchronisation
    profile = load_profile(args.profile)
    alpha = profile.language.acceptance
    slots = max(args.streams) + 1
    rows = []
    engines = {gamma: emulated_engine(args.profile, gamma, args.time_scale, slots) for gamma in (0, *args.gammas)}
    prompts = [engines[0].encode(p) for p in bundled_prompts()[: max(1, args.prompts)]]
    for streams in args.streams:
        context = sum(len(p) for p in prompts) // len(prompts) + args.max_new_tokens // 2
        c = (profile.draft.latency.forward_ms(streams, streams, streams * context)
             / profile.target.latency.forward_ms(streams, streams, streams * context))
        off = run(engines[0], prompts, streams, args.max_new_tokens)
        rows.append({"streams": streams, "gamma": 0, **off, "c": c, "predicted": 1.0, "speedup": 1.0})
        for gamma in args.gammas:
            on = run(engines[gamma], prompts, streams, args.max_new_tokens)
            rows.append({"streams": streams, "gamma": gamma, **on, "c": c, "predicted": predict(alpha, gamma, c),
                         "speedup": on["tokens_per_s"] / off["tokens_per_s"]})
    return rows


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    profile = load_profile(args.profile)
    print(f"\nemulated devices: {args.profile} ({profile.target.name}; draft {profile.draft.name}), "
          f"device times x{args.time_scale}; profile α = {profile.language.acceptance}; greedy, "
          f"{args.max_new_tokens} new tokens per request; in-process engine\n")
    print("| streams | speculation | tokens/s | α₁ | acceptance rate | mean accepted length | c | "
          "predicted speedup | measured speedup | measured / predicted | framework ms/round | late ms/round |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mode = "OFF" if r["gamma"] == 0 else f"ON, γ {r['gamma']}"
        print(f"| {r['streams']} | {mode} | {r['tokens_per_s']:.1f} | {r['alpha_1']:.3f} | "
              f"{r['acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | {r['c']:.3f} | "
              f"{r['predicted']:.2f} | {r['speedup']:.2f} | {r['speedup'] / r['predicted']:.2f} | "
              f"{r['framework_ms_per_round']:.3f} | {r['late_ms_per_round']:.3f} |")
