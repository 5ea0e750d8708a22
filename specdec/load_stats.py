"""Load and speculation measurements as additive sums, so replicas can merge them.

Every router replica adds what it observes (arrivals, rounds, drafted/accepted tokens per
position, draft and verify timings per batch-size bucket) into time windows; a store sums
the recent windows of all replicas and `LoadSnapshot.from_window` turns the sums into the
figures the policy needs: QPS, acceptance rate α (recent windows only, so it decays), and
the cost ratios c and s of `specdec.gamma.CostModel`, measured rather than configured.

Verify time at a bucket is fitted as a + b·x, x = tokens verified per sequence (γ + 1), by
least squares over the window; one plain target step is a + b, so s = b / (a + b), and
c = mean draft step time / (a + b).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from specdec.gamma import CostModel


def batch_bucket(batch_size: int) -> int:
    """Batch sizes are grouped in powers of two: 1, 2, 4, 8, ..."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return 1 << (batch_size - 1).bit_length()


@dataclass(frozen=True)
class RoundSample:
    """What one batched round cost and yielded.

    batch_size: sequences in the round; gamma: the batch's γ (0 = plain decoding);
    drafted / accepted: summed over sequences; accepted_per_position[i]: sequences whose
    i-th drafted token was accepted; drafted_per_position likewise for offered ones;
    draft_seconds: the proposer call (γ draft steps); verify_seconds: the target call.
    """

    batch_size: int
    gamma: int
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()


@dataclass
class StatsWindow:
    """Additive sums over a time window (a flat str -> float mapping, e.g. a Redis hash)."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, key: str, value: float) -> None:
        self.sums[key] += value

    def add_arrival(self, count: int = 1) -> None:
        self.add("arrivals", count)

    def add_round(self, sample: RoundSample) -> None:
        self.add("rounds", 1)
        self.add("drafted", sample.drafted)
        self.add("accepted", sample.accepted)
        for i, (d, a) in enumerate(zip(sample.drafted_per_position, sample.accepted_per_position)):
            self.add(f"drafted_pos:{i}", d)
            self.add(f"accepted_pos:{i}", a)
        b = batch_bucket(sample.batch_size)
        x, y = float(sample.gamma + 1), sample.verify_seconds
        for name, value in (("n", 1), ("x", x), ("y", y), ("xx", x * x), ("xy", x * y)):
            self.add(f"verify:{b}:{name}", value)
        if sample.gamma > 0:
            self.add(f"draft:{b}:steps", sample.gamma)
            self.add(f"draft:{b}:seconds", sample.draft_seconds)

    def merge(self, other: "StatsWindow | dict[str, float]") -> None:
        items = other.sums.items() if isinstance(other, StatsWindow) else other.items()
        for key, value in items:
            self.add(key, float(value))

    def get(self, key: str) -> float:
        return self.sums.get(key, 0.0)


@dataclass(frozen=True)
class LoadSnapshot:
    """The cluster-wide picture the policy decides from."""

    qps: float
    in_flight: float
    queued: float
    alpha: float | None  # None when nothing was drafted recently
    alpha_per_position: tuple[float, ...]
    # bucket -> (a, b): verify seconds ≈ a + b·tokens per sequence; b None = only one γ seen
    verify_fit: dict[int, tuple[float, float | None]]
    draft_step_seconds: dict[int, float]  # bucket -> mean seconds of one draft step
    measured_at: float
    mean_tokens_per_seq: dict[int, float] = field(default_factory=dict)  # bucket -> mean γ + 1 verified

    def _mean_x(self, bucket: int) -> float:
        return self.mean_tokens_per_seq.get(bucket, 1.0)

    @classmethod
    def from_window(
        cls, window: StatsWindow, window_s: float, in_flight: float, queued: float, measured_at: float
    ) -> "LoadSnapshot":
        drafted = window.get("drafted")
        positions = []
        i = 0
        while window.get(f"drafted_pos:{i}") > 0:
            positions.append(window.get(f"accepted_pos:{i}") / window.get(f"drafted_pos:{i}"))
            i += 1
        return cls(
            qps=window.get("arrivals") / window_s if window_s > 0 else 0.0,
            in_flight=in_flight,
            queued=queued,
            alpha=window.get("accepted") / drafted if drafted > 0 else None,
            alpha_per_position=tuple(positions),
            verify_fit=_verify_fits(window),
            draft_step_seconds=_draft_steps(window),
            measured_at=measured_at,
            mean_tokens_per_seq={
                int(k.split(":")[1]): window.get(k.replace(":n", ":x")) / window.get(k)
                for k in list(window.sums)
                if k.startswith("verify:") and k.endswith(":n") and window.get(k) > 0
            },
        )

    def cost_model(self, batch_size: int, default_slope: float) -> CostModel | None:
        """c and s at this batch size, from the nearest measured bucket (None if none)."""
        if not self.verify_fit:
            return None
        bucket = min(self.verify_fit, key=lambda b: abs(b.bit_length() - batch_bucket(batch_size).bit_length()))
        a, b = self.verify_fit[bucket]
        if b is None:  # one γ only: the per-token slope is unknown, assume the default
            step = a / (1.0 + default_slope * (self._mean_x(bucket) - 1.0))
            slope = default_slope
        else:
            b = max(0.0, b)
            step, slope = a + b, (b / (a + b) if a + b > 0 else default_slope)
        if step <= 0:
            return None
        draft = self.draft_step_seconds.get(bucket)
        return CostModel(draft_cost=(draft / step) if draft else 0.0, verify_slope=max(0.0, slope))


def _verify_fits(window: StatsWindow) -> dict[int, tuple[float, float | None]]:
    fits = {}
    for key in list(window.sums):
        if not (key.startswith("verify:") and key.endswith(":n")):
            continue
        bucket = int(key.split(":")[1])
        get = lambda name: window.get(f"verify:{bucket}:{name}")  # noqa: E731
        n, sx, sy, sxx, sxy = get("n"), get("x"), get("y"), get("xx"), get("xy")
        if n <= 0:
            continue
        var = n * sxx - sx * sx
        if var <= 1e-9 * max(1.0, n * sxx):  # one x value only: mean seconds at that x, no slope
            fits[bucket] = (sy / n, None)
            continue
        b = (n * sxy - sx * sy) / var
        fits[bucket] = ((sy - b * sx) / n, b)
    return fits


def _draft_steps(window: StatsWindow) -> dict[int, float]:
    steps = {}
    for key in list(window.sums):
        if key.startswith("draft:") and key.endswith(":steps") and window.get(key) > 0:
            bucket = int(key.split(":")[1])
            steps[bucket] = window.get(f"draft:{bucket}:seconds") / window.get(key)
    return steps
