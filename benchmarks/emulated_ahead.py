"""Drafting ahead on emulated devices, in-process: sequential rounds beside drafting ahead.

The in-process engine verifies in the round's own thread, so it never drafts ahead; on
emulated devices, whose forwards wait instead of computing, the target can verify on a
thread of its own while the draft drafts (`ConcurrentVerifier`), as a target on its own
device does. So this runs the production engine with `DraftAhead` (the served default: each
kind of step measures its ways and keeps the fastest; or one fixed way) against the plain
engine's sequential rounds at a fixed γ, without the served path's hops: what drafting ahead
itself gains on the profile (docs/drafting_ahead.md compares it with a model of the gain).

Every setup runs `--runs` times, interleaved (sequential, then each drafting-ahead setup, per
stream count and run), after one unmeasured warm-up pass per setup and stream count (the
measured choices settle there). Reported: tokens/s, rounds, mean accepted length, the
look-ahead hit rate and the share of rounds run each way, each setup's tokens/s over the
sequential run just before it (median and range over the runs), the wall time per step, the
draft's time per step (the proposals the step waited for plus its look-ahead) and the share
of that time hidden behind the target's verify.

    python benchmarks/emulated_ahead.py --profile h100-llama-8b-1b [--streams 1,8,32] [--runs 2] [--gamma 4]
        [--fresh-misses]   (each setup also with missed rows proposed for afresh, interleaved)
        [--no-free-core]   (the draft's work during a verify runs after it: looking ahead loses)
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from emulated_core import emulated_engine
from specdec.models.model_paths import bundled_prompts
from specdec.requests.request import GenerationRequest
from specdec.round.draft_ahead import DraftAhead
from specdec.round.overlap_choice import LOOK_AHEAD, SEQUENTIAL
from specdec.verifiers.verifier import Verifier, VerifyRequest, VerifyResult

# label -> DraftAhead's arguments (way None: measured); "sequential through drafting ahead": every
# step sequential with DraftAhead in the round (what its machinery costs where the choice says sequential)
SETUPS = {"drafting ahead": {"way": None}, "look-ahead only": {"way": LOOK_AHEAD},
          "sequential through drafting ahead": {"way": SEQUENTIAL}}
# with --fresh-misses: the same, but a row whose look-ahead missed is proposed for afresh (the
# behaviour before plain misses), for an interleaved comparison in one run
FRESH_MISSES = {f"{label}, misses proposed afresh": {**kwargs, "plain_misses": False}
                for label, kwargs in SETUPS.items()}


class ConcurrentVerifier(Verifier):
    """A verifier whose verify_async runs on a thread of its own (the target's device)."""

    runs_concurrently = True

    def __init__(self, inner: Verifier) -> None:
        self.inner = inner
        self.vocab_size, self.max_seq_len = inner.vocab_size, inner.max_seq_len
        self.runner = getattr(inner, "runner", None)  # the target model (its emulated device)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="target")

    @property
    def num_free_slots(self) -> int:
        return self.inner.num_free_slots

    def admits(self, reserve_tokens: list[int]) -> int:
        return self.inner.admits(reserve_tokens)

    def verify(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        return self.inner.verify(requests)

    def verify_async(self, requests: list[VerifyRequest]):
        return self._thread.submit(self._timed, requests)  # a Future: .result() waits

    def _timed(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        start = time.perf_counter()
        try:
            return self.inner.verify(requests)
        finally:
            self.last_verify_s = time.perf_counter() - start  # read by MeasuredDraftAhead

    def release(self, seq_id: str) -> None:
        self.inner.release(seq_id)


class SerialVerifier(ConcurrentVerifier):
    """A verifier that verifies before verify_async returns, so the draft's work during the
    verify runs after it: a host without a free core for the draft (--no-free-core), where
    looking ahead loses and the measured choice should leave it."""

    def verify_async(self, requests: list[VerifyRequest]):
        done = Future()
        done.set_result(self._timed(requests))
        return done


class MeasuredDraftAhead(DraftAhead):
    """DraftAhead that also sums how much of each look-ahead ran while the target verified
    (hidden) and how much outlasted the verify (on the round's critical path)."""

    def __init__(self, verifier: ConcurrentVerifier, **kwargs) -> None:
        super().__init__(**kwargs)
        self.verifier = verifier
        self.ahead_s = self.hidden_s = 0.0

    def verdict_waited(self, ahead_s: float, waited_s: float) -> None:
        super().verdict_waited(ahead_s, waited_s)
        self.ahead_s += ahead_s
        self.hidden_s += min(ahead_s, getattr(self.verifier, "last_verify_s", 0.0))


def engines(args: argparse.Namespace, slots: int) -> dict:
    """label -> engine: the plain one (sequential rounds) and one per drafting-ahead setup."""
    found = {"sequential": emulated_engine(args.profile, args.gamma, args.time_scale, slots)}
    for label, kwargs in {**SETUPS, **(FRESH_MISSES if getattr(args, "fresh_misses", False) else {})}.items():
        built = emulated_engine(args.profile, args.gamma, args.time_scale, slots)
        built.engine.verifier = (SerialVerifier if getattr(args, "no_free_core", False)
                                 else ConcurrentVerifier)(built.engine.verifier)
        built.engine.draft_ahead = MeasuredDraftAhead(built.engine.verifier, **kwargs)
        found[label] = built
    return found


def decode_all(engine, prompts: list[list[int]], streams: int, max_new: int) -> tuple[int, float]:
    """Every prompt once, `streams` requests at a time, each batch to its end: (tokens, seconds)."""
    start, tokens = time.perf_counter(), 0
    for first in range(0, len(prompts), streams):
        ids = [engine.add_request(GenerationRequest(prompts[(first + i) % len(prompts)], max_new))
               for i in range(streams)]
        while engine.has_unfinished():
            engine.step()
        tokens += sum(len(engine.result(i).token_ids) for i in ids)
    return tokens, time.perf_counter() - start


def run(built, prompts: list[list[int]], streams: int, max_new: int) -> dict:
    """Decode every prompt once, `streams` requests together (one stream: the prompts one after
    another, as bench_serving.py's streams take them; before, one stream decoded the first
    only): tokens/s, rounds, accepted length, hit rate, the draft's time per round and the
    share of it hidden behind the target's verify (the look-ahead's time within the verify,
    over that and the proposals the rounds waited for)."""
    engine, ahead = built.engine, built.engine.draft_ahead
    before, profile = engine.stats.to_dict(), engine.timer.profile.to_dict()
    spans = (ahead.ahead_s, ahead.hidden_s) if ahead else (0.0, 0.0)
    looked, hits = (ahead.rows_ahead, ahead.hits) if ahead else (0, 0)
    ways = dict(ahead.steps_by_way) if ahead else {}
    tokens, wall = decode_all(engine, prompts, streams, max_new)
    rounds = engine.stats.rounds - before["rounds"]
    accepted = engine.stats.accepted - before["accepted"]
    looked, hits = (ahead.rows_ahead - looked, ahead.hits - hits) if ahead else (0, 0)
    steps = {way: n - ways.get(way, 0) for way, n in ahead.steps_by_way.items()} if ahead else {}
    ways_share = {way: n / sum(steps.values()) for way, n in steps.items() if n} if steps else {}
    after = engine.timer.profile.to_dict()
    steps_done = after["rounds"] - profile["rounds"]
    waited = (after["propose_s"] - after["overlap_s"]) - (profile["propose_s"] - profile["overlap_s"])
    ahead_s, hidden_s = (ahead.ahead_s - spans[0], ahead.hidden_s - spans[1]) if ahead else (0.0, 0.0)
    draft_s = waited + ahead_s
    return {"ways": ways_share, "tokens_per_s": tokens / wall, "rounds": rounds,
            "mean_accepted_length": (accepted + rounds) / rounds,
            "hit_rate": hits / looked if looked else None, "rows_ahead": looked,
            "round_ms": 1000 * wall / steps_done, "draft_ms": 1000 * draft_s / steps_done,
            "hidden": hidden_s / draft_s if draft_s > 0 else 0.0}


def measure(args: argparse.Namespace) -> list[dict]:
    """Interleaved runs of every setup at every stream count (after a warm-up pass each)."""
    torch.set_num_threads(1)
    built = engines(args, max(args.streams) + 8)
    prompts = [built["sequential"].encode(p) for p in bundled_prompts()[: max(1, args.prompts)]]
    rows = []
    for streams in args.streams:
        for engine in built.values():
            run(engine, prompts, streams, args.max_new_tokens // 2)  # warm-up: the measured choices settle
        for number in range(1, args.runs + 1):
            for label, engine in built.items():
                row = {"setup": label, "streams": streams, "run": number,
                       **run(engine, prompts, streams, args.max_new_tokens)}
                rows.append(row)
                ways = ", ".join(f"{way} {share:.0%}" for way, share in row["ways"].items())
                print(f"  run {number}: {label} x{streams}: {row['tokens_per_s']:.1f} tokens/s {ways} "
                      f"hit {row['hit_rate'] or 0:.0%} hidden {row['hidden']:.0%}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Median per setup and stream count, and the ratio over the sequential run before each."""
    lines = ["| streams | setup | tokens/s (median) | over sequential (median, range) | mean accepted length "
             "| look-ahead hit rate | step ms | draft ms per step | hidden behind the verify |",
             "|---:|---|---:|---|---:|---:|---:|---:|---:|"]
    last, groups = {}, {}
    for row in rows:
        if row["setup"] == "sequential":
            last[row["streams"]] = row
        ratio = row["tokens_per_s"] / last[row["streams"]]["tokens_per_s"]
        groups.setdefault((row["streams"], row["setup"]), []).append((row, ratio))
    for (streams, setup), group in groups.items():
        ratios = [ratio for _, ratio in group]
        hits = [r["hit_rate"] for r, _ in group if r["hit_rate"] is not None]
        lines.append(f"| {streams} | {setup} | {statistics.median(r['tokens_per_s'] for r, _ in group):.1f} | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
                     f"{statistics.median(r['mean_accepted_length'] for r, _ in group):.2f} | "
                     f"{'–' if not hits else f'{statistics.median(hits):.0%}'} | "
                     f"{statistics.median(r['round_ms'] for r, _ in group):.2f} | "
                     f"{statistics.median(r['draft_ms'] for r, _ in group):.2f} | "
                     f"{statistics.median(r['hidden'] for r, _ in group):.0%} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h100-llama-8b-1b")
    ap.add_argument("--streams", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 8, 32))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--fresh-misses", action="store_true",
                    help="also run each setup with missed rows proposed for afresh (interleaved)")
    ap.add_argument("--no-free-core", action="store_true",
                    help="drafting ahead verifies before it drafts (no free core for the draft: looking ahead loses)")
    args = ap.parse_args()
    print(table(measure(args)))


if __name__ == "__main__":
    main()
