"""Measure a real model's forward times on its device and fit a LatencyModel to them.

`specdec profile` runs this for a target and a draft and writes a device profile, so that a
user with an accelerator can emulate their own hardware (and check the shipped profiles).
Each point is the median of several timed forwards after a warm-up, synchronised with the
device (CUDA kernels run asynchronously). Four families of forwards pin the four terms:

* one row, one token, short context: the memory-bound floor (base_ms + per_row_ms);
* one row of T tokens for growing T (a prefill): past the knee the time rises by
  per_token_ms per token; the knee is where that line meets the floor;
* R rows of one token: what each further row adds (per_row_ms);
* one row, one token, after a short and after a long context: per_context_token_ms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.models.emulated_profile import LatencyModel
from specdec.models.model_runner import ModelRunner


@dataclass
class Measurements:
    """Median forward times in ms: `points` maps (rows, tokens per row, context per row) to ms."""

    points: dict[tuple[int, int, int], float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"rows={r} tokens/row={t} context/row={c}: {ms:.3f} ms" for (r, t, c), ms in self.points.items()]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(runner: ModelRunner, rows: int, tokens: int, context: int, repeats: int) -> float:
    """Median ms of a forward of `rows` rows of `tokens` new tokens each after `context` cached tokens."""
    generator = torch.Generator().manual_seed(rows * 7919 + tokens * 31 + context)
    slots = [runner.allocate_slot() for _ in range(rows)]
    try:
        vocab = runner.vocab_size
        if context:
            ids = torch.randint(1, vocab, (rows, context), generator=generator).tolist()
            runner.forward(slots, ids, last_only=True)
        times = []
        for _ in range(repeats + 2):  # two warm-up forwards
            # fresh tokens each time: the prefix cache must not serve the previous repeat's blocks
            new = torch.randint(1, vocab, (rows, tokens), generator=generator).tolist()
            for slot in slots:
                runner.truncate(slot, context)
            _synchronize(runner.model.device)
            start = time.perf_counter()
            runner.forward(slots, new, last_only=True)
            _synchronize(runner.model.device)
            times.append((time.perf_counter() - start) * 1000.0)
        return statistics.median(times[2:])
    finally:
        for slot in slots:
            runner.free_slot(slot)


def measure(runner: ModelRunner, repeats: int = 10, rows: int = 16,
            progress: Callable[[str], None] = lambda line: None) -> Measurements:
    """Time the four families of forwards (see the module docstring) within the runner's limits."""
    result = Measurements()
    for point in measurement_points(runner.max_seq_len, min(rows, runner.cache.num_slots)):
        result.points[point] = time_forward(runner, *point, repeats=repeats)
        progress(result.lines()[-1])
    return result


def measurement_points(max_seq_len: int, rows: int) -> list[tuple[int, int, int]]:
    """(rows, tokens per row, context per row) of each forward `measure` times."""
    short = min(16, max_seq_len // 4)
    points = [(1, 1, short), (rows, 1, short), (1, 1, max_seq_len - 2)]
    tokens = 32
    while tokens <= max_seq_len - short - 1:
        points.append((1, tokens, short))
        tokens *= 2
    return points


def fit(measured: Measurements) -> LatencyModel:
    """The LatencyModel through the measured points (terms clamped at zero)."""
    points = measured.points
    floor_key = min(k for k in points if k[0] == 1 and k[1] == 1)  # one token after a short context
    floor = points[floor_key]
    long_key = max(k for k in points if k[0] == 1 and k[1] == 1)
    span = long_key[2] - floor_key[2]
    per_context = max(0.0, (points[long_key] - floor) / span) if span > 0 else 0.0
    prefill = sorted((t, ms) for (r, t, c), ms in points.items() if r == 1 and c == floor_key[2] and t > 1)
    top = prefill[-2:]  # the compute-bound end: ms = intercept + slope * T (T also adds attended context)
    slope, intercept = _line([t for t, _ in top], [ms for _, ms in top]) if len(top) >= 2 else (0.0, floor)
    per_token = max(0.0, slope - per_context)
    knee = (floor - intercept - per_context) / per_token if per_token > 0 else float(max(t for t, _ in prefill))
    knee = max(1.0, knee)
    many = max(k for k in points if k[1] == 1 and k[2] == floor_key[2])
    rows = many[0]
    extra = points[many] - floor - per_token * max(0.0, rows - knee) - per_context * (rows - 1) * (floor_key[2] + 1)
    per_row = max(0.0, extra / (rows - 1)) if rows > 1 else 0.0
    base = max(0.0, floor - per_row - per_context * (floor_key[2] + 1))
    return LatencyModel(base_ms=round(base, 4), per_row_ms=round(per_row, 5), knee_tokens=round(knee, 1),
                        per_token_ms=round(per_token, 6), per_context_token_ms=round(per_context, 8))


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var else 0.0
    return slope, mean_y - slope * mean_x
