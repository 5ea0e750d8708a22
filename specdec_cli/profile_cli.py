"""`specdec profile`: measure a real target and draft on this machine's device and write a device profile.

The file has the shape of configs/devices/*.yaml, so `emulated:<file>:target` and
`emulated:<file>:draft` then emulate this hardware anywhere (a CPU-only machine, CI). The
measurements themselves are written above the fitted figures as comments.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def add_profile_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("profile", help="measure a real target and draft on this device and write a "
                              "latency profile for emulated models (configs/devices/*.yaml)")
    p.add_argument("--target", default="bundled:target", help="target model: local dir, hub id or bundled:target")
    p.add_argument("--draft", default="bundled:draft", help="draft model: local dir, hub id or bundled:draft")
    p.add_argument("--device", default="cpu", help="torch device to measure on, e.g. cuda:0 (default cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="compute dtype")
    p.add_argument("--max-seq-len", type=int, default=1024, help="longest context measured (default 1024)")
    p.add_argument("--rows", type=int, default=16, help="rows of the batched forward measured (default 16)")
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per point; the median counts")
    p.add_argument("--acceptance", type=float, default=0.7, help="α the emulated draft is accepted at (default 0.7)")
    p.add_argument("--out", required=True, help="profile file to write (.yaml)")
    p.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    from specdec.models.emulated_profile import DeviceProfile, LanguageSpec, write_profile

    if not str(args.out).endswith((".yaml", ".yml")):
        raise ValueError(f"--out {args.out!r} must end in .yaml (emulated:<file>.yaml:<role> names it)")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    notes = [f"Measured by `specdec profile` on {_device_name(args.device)} ({args.dtype}), {when}; "
             f"median of {args.repeats} forwards."]
    models = {role: _measured_model(role, name, args, notes)
              for role, name in (("target", args.target), ("draft", args.draft))}
    profile = DeviceProfile(description=notes[0], language=LanguageSpec(acceptance=args.acceptance), **models)
    write_profile(profile, Path(args.out), header="\n".join(notes))
    print(f"specdec profile: wrote {args.out} (use models.target: emulated:{args.out}:target, "
          f"models.draft: emulated:{args.out}:draft)", flush=True)
    return 0


def _measured_model(role: str, name: str, args: argparse.Namespace, notes: list[str]) -> Any:
    """Load `name` on the device, time its forwards (appending them to `notes`), fit its DeviceModel."""
    from specdec.models.model_paths import resolve_model_path
    from specdec.models.emulated_profile import DeviceModel
    from specdec.models.latency_fit import fit, measure
    from specdec.models.model_runner import ModelRunner

    runner = ModelRunner.from_pretrained(resolve_model_path(name), num_slots=args.rows,
                                         max_seq_len=args.max_seq_len, dtype=args.dtype, device=args.device)
    print(f"specdec profile: measuring the {role} {name} ...", file=sys.stderr, flush=True)
    measured = measure(runner, args.repeats, args.rows,
                       progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    notes += [f"{role} {name}:"] + [f"  {line}" for line in measured.lines()]
    config = runner.model.config
    return DeviceModel(name=f"{name} ({args.dtype}) on {_device_name(args.device)}",
                       num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                       intermediate_size=config.intermediate_size,
                       max_position_embeddings=config.max_position_embeddings, latency=fit(measured))


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))} ({device})"
    return device
