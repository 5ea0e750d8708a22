"""Where a speculative round's host work goes on the emulated pair: CPU µs per round by part
and torch operations per round by part, with device times at 0.

The in-process engine (greedy, γ 4, `--streams` requests of `--max-new-tokens`) runs on
`--profile`'s emulated pair with device times scaled to 0; everything inside an emulated
device's `run` (its wait, and the emulated model's own work, which counts within the device
time) is subtracted, so what is left is the framework's host work: the thread's CPU time
(`time.thread_time`, min over `--passes`), split into the draft's proposal (its catch-up
forward apart), the verify, the engine's applying of the verdicts (stop checks, detokenizing,
statistics) and `ModelRunner.forward`'s glue (per forward). A last pass counts
the aten operations dispatched outside the devices, by the innermost part that ran them
("engine": none of these). Usage:
    python benchmarks/host_parts.py [--profile h100-llama-8b-1b] [--streams 1,8,32] [--passes 5]
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import emulated_core
from specdec.models import emulated_device
from specdec.models.model_paths import bundled_prompts
from specdec.models.model_runner import ModelRunner
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.requests.request import GenerationRequest
from specdec.round.engine import SpeculativeEngine
from specdec.verifiers.target_verifier import TargetVerifier

PARTS = ((DraftModelProposer, "propose", "draft"), (DraftModelProposer, "_catch_up", "catch-up"),
         (TargetVerifier, "verify", "verify"), (ModelRunner, "forward", "forward"),
         (SpeculativeEngine, "_apply_all", "apply"))


class _Meter:
    """Wraps the devices' `run` and the parts' methods: CPU time outside the devices, calls, ops."""

    def __init__(self) -> None:
        self.device_s, self.in_device, self.stack = 0.0, False, []
        self.cpu, self.calls, self.ops = collections.Counter(), collections.Counter(), collections.Counter()
        run = emulated_device.EmulatedDevice.run

        def device_run(device, seconds, work):
            start, self.in_device = time.thread_time(), True
            try:
                return run(device, seconds, work)
            finally:
                self.in_device, self.device_s = False, self.device_s + time.thread_time() - start
        emulated_device.EmulatedDevice.run = device_run
        for cls, name, label in PARTS:
            setattr(cls, name, self._timed(getattr(cls, name), label))

    def _timed(self, method, label: str):
        def timed(*args, **kwargs):
            start, device, _ = time.thread_time(), self.device_s, self.stack.append(label)
            try:
                return method(*args, **kwargs)
            finally:
                self.stack.pop()
                self.cpu[label] += time.thread_time() - start - (self.device_s - device)
                self.calls[label] += 1
        return timed

    def counter(self) -> TorchDispatchMode:
        meter = self

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not meter.in_device:
                    meter.ops[meter.stack[-1] if meter.stack else "engine"] += 1
                return func(*args, **(kwargs or {}))
        return Count()


def measure(profile: str, streams: int, passes: int, max_new: int, meter: _Meter) -> str:
    built = emulated_core.emulated_engine(profile, 4, 0.0, streams + 1)
    prompts = [built.encode(p) for p in bundled_prompts()[:4]]
    engine, best = built.engine, None
    for p in range(passes + 1):
        engine.generate([GenerationRequest(prompts[0], 4)])  # warm-up
        for i in range(streams):
            engine.add_request(GenerationRequest(prompts[i % len(prompts)], max_new))
        engine.step()  # the prefill round: not a steady-state round
        meter.cpu.clear(), meter.calls.clear(), meter.ops.clear()
        counting, rounds, meter.device_s = p == passes, 0, 0.0
        counter = meter.counter() if counting else None
        if counter:
            counter.__enter__()
        start = time.thread_time()
        while engine.has_unfinished():
            engine.step()
            rounds += 1
        total = time.thread_time() - start - meter.device_s
        if counter:
            counter.__exit__(None, None, None)
            ops = ", ".join(f"{k} {v / rounds:.1f}" for k, v in meter.ops.most_common())
        elif best is None or total < best[0]:
            best = (total, dict(meter.cpu), dict(meter.calls), rounds)
    total, cpu, calls, rounds = best
    us = {k: v / rounds * 1e6 for k, v in cpu.items()}
    forwards = calls["forward"] / rounds
    return (f"| {streams} | {total / rounds * 1e6:.0f} | {us['draft']:.0f} ({us['catch-up']:.0f}) | {us['verify']:.0f} "
            f"| {us['apply']:.0f} | {forwards:.1f} x {us['forward'] / forwards:.0f} | {ops} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h100-llama-8b-1b")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    torch.set_num_threads(1)
    meter = _Meter()
    print("| streams | host µs/round | draft (its catch-up) | verify | applying verdicts | forwards x glue µs "
          "| aten ops/round outside the devices, by part |")
    print("|---|---|---|---|---|---|---|")
    for streams in (int(s) for s in args.streams.split(",")):
        print(measure(args.profile, streams, args.passes, args.max_new_tokens, meter), flush=True)


if __name__ == "__main__":
    main()
