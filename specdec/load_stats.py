"""Load and speculation measurements as additive sums, so replicas can merge them.

Every router replica adds what it observes (arrivals, rounds, drafted/accepted tokens per
position, draft and verify timings per batch-size bucket) into time windows; a store sums
the recent windows of all replicas and `LoadSnapshot.from_window` turns the sums into the
figures the policy needs: QPS, acceptance rate α (recent windows only, so it decays), and
the cost ratios c and s of `specdec.gamma.CostModel`, measured rather than configured.

Verify time at a bucket is fitted as a + b·x, x = tokens verified per sequence (γ + 1), by
least squares over the window; one plain target step is a + b, so s = b / (a + b). Draft
call time is fitted as d0 + d1·γ: c = d1 / (a + b) per drafted token and o = d0 / (a + b)
per round (the call's fixed overhead). With one γ only, slopes are unknown: s falls back
to a configured default and the draft time is spread evenly over its steps (o = 0).
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

    @classmethod
    def from_rows(cls, drafted: list[int], accepted: list[int], draft_s: float, verify_s: float) -> "RoundSample":
        """A batched round's measurements from each row's drafted and accepted counts."""
        gamma = max(drafted, default=0)
        per_drafted = [sum(1 for d in drafted if d > i) for i in range(gamma)]
        per_accepted = [sum(1 for a in accepted if a > i) for i in range(gamma)]
        return cls(len(drafted), gamma, sum(drafted), sum(accepted), draft_s, verify_s,
                   tuple(per_accepted), tuple(per_drafted))


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
        self.add("sequence_rounds", sample.batch_size)
        self.add("drafted", sample.drafted)
        self.add("accepted", sample.accepted)
        for i, (d, a) in enumerate(zip(sample.drafted_per_position, sample.accepted_per_position)):
            self.add(f"drafted_pos:{i}", d)
            self.add(f"accepted_pos:{i}", a)
        b = batch_bucket(sample.batch_size)
        self._add_point(f"verify:{b}", float(sample.gamma + 1), sample.verify_seconds)
        if sample.gamma > 0:
            self._add_point(f"draft:{b}", float(sample.gamma), sample.draft_seconds)

    def _add_point(self, prefix: str, x: float, y: float) -> None:
        """Least-squares sums of y ≈ a + b·x under `prefix`."""
        for name, value in (("n", 1), ("x", x), ("y", y), ("xx", x * x), ("xy", x * y)):
            self.add(f"{prefix}:{name}", value)

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
    mean_accepted_length: float | None  # (accepted + sequence rounds) / sequence rounds; None = no rounds
    # bucket -> (a, b): verify seconds ≈ a + b·tokens per sequence; b None = only one γ seen
    verify_fit: dict[int, "LinearFit"]  # bucket -> verify seconds ≈ a + b·(γ + 1)
    draft_fit: dict[int, "LinearFit"]  # bucket -> draft call seconds ≈ a + b·γ
    measured_at: float

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
            mean_accepted_length=(window.get("accepted") + rows) / rows if (rows := window.get("sequence_rounds")) else None,
            verify_fit=_fits(window, "verify"),
            draft_fit=_fits(window, "draft"),
            measured_at=measured_at,
        )

    def cost_model(self, batch_size: int, default_slope: float) -> CostModel | None:
        """c, s and o at this batch size, from the nearest measured bucket (None if none)."""
        if not self.verify_fit:
            return None
        bucket = min(self.verify_fit, key=lambda b: abs(b.bit_length() - batch_bucket(batch_size).bit_length()))
        verify = self.verify_fit[bucket]
        if verify.slope is None:  # one γ only: assume the default slope around the mean
            step = verify.mean_y / (1.0 + default_slope * (verify.mean_x - 1.0))
            slope = default_slope
        else:
            b = max(0.0, verify.slope)
            step = verify.intercept + b
            slope = b / step if step > 0 else default_slope
        if step <= 0:
            return None
        draft = self.draft_fit.get(bucket)
        if draft is None:
            return CostModel(draft_cost=0.0, verify_slope=slope)
        if draft.slope is None or draft.slope <= 0 or draft.intercept < 0:
            return CostModel(draft_cost=draft.mean_y / draft.mean_x / step, verify_slope=slope)
        return CostModel(draft_cost=draft.slope / step, verify_slope=slope, draft_overhead=draft.intercept / step)


@dataclass(frozen=True)
class LinearFit:
    """y ≈ intercept + slope·x by least squares; slope None when only one x was seen."""

    intercept: float
    slope: float | None
    mean_x: float
    mean_y: float


def _fits(window: StatsWindow, kind: str) -> dict[int, LinearFit]:
    fits = {}
    for key in list(window.sums):
        if not (key.startswith(f"{kind}:") and key.endswith(":n")) or window.get(key) <= 0:
            continue
        bucket = int(key.split(":")[1])
        n, sx, sy, sxx, sxy = (window.get(f"{kind}:{bucket}:{name}") for name in ("n", "x", "y", "xx", "xy"))
        var = n * sxx - sx * sx
        if var <= 1e-9 * max(1.0, n * sxx):  # one x value only: no slope information
            fits[bucket] = LinearFit(sy / n, None, sx / n, sy / n)
            continue
        slope = (n * sxy - sx * sy) / var
        fits[bucket] = LinearFit((sy - slope * sx) / n, slope, sx / n, sy / n)
    return fits
