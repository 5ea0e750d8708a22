"""Load and speculation measurements as additive sums, so replicas can merge them.

Every router replica adds what it observes (arrivals, rounds, drafted/accepted tokens per
position, and each round's timings with its shape) into time windows; a store sums the
recent windows of all replicas and `LoadSnapshot.from_window` turns the sums into the
figures the policy needs: QPS and the batch over the recent load window, and over the
longer cost window the deployment's own figures (`is_deployment_key`): acceptance rate α,
per-position acceptance and the round cost model (`specdec.policy.round_cost`), measured
rather than configured.

Acceptance belongs to the deployment (the proposer and target pair, the traffic's mix of
prompts), not to the moment's load, as a round's cost does. Over a load window of a few
seconds at light load it is one or two requests' α: one hard prompt can make the plan
switch speculation off, and while it is off the window holds too few drafts to measure α
again, so the policy would go on planning with that one request's α. A request's own α still
moves its own γ at once (`specdec.policy.prefix_acceptance.row_prefix_acceptance`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from specdec.policy.round_cost import RoundCostModel, RoundShape, add_round_timing, add_row_waits, is_cost_key


MIN_POSITION_SAMPLES = 8  # drafted tokens a position needs before its acceptance is reported
# the sums kept over the cost window besides the cost model's: acceptance (drafted, accepted,
# drafted_pos:*, accepted_pos:*) and the rows it was measured over (mean accepted length)
ACCEPTANCE_KEYS = ("drafted", "accepted", "sequence_rounds")


def is_deployment_key(key: str) -> bool:
    """Whether a sum describes the deployment (kept over the cost window): the round cost
    model's, or acceptance's."""
    return is_cost_key(key) or key.startswith(ACCEPTANCE_KEYS)


@dataclass(frozen=True)
class RoundSample:
    """What one batched round cost and yielded.

    batch_size: sequences in the round; gamma: the largest γ asked (0 = plain decoding);
    drafted / accepted: summed over sequences; accepted_per_position[i]: sequences whose
    i-th drafted token was accepted; drafted_per_position likewise for offered ones;
    draft_seconds: the proposer call; verify_seconds: the target call; draft_rows: rows the
    proposer was asked to draft for; round_seconds: the whole round (0 = not measured);
    prefill_tokens: prompt tokens the target read this round besides each row's pending
    token (rows in their first round), which its verify time includes; prefill_rows: those
    rows; catch_up_tokens: tokens of the drafting rows' histories the proposer read before
    drafting; planned_seconds: the round as its plan predicted it (0 = no priced plan);
    waited_rows / waited_seconds: rows the round emitted for that had emitted before, and
    the seconds they waited since then in all; decode_seconds: the decoding round their
    plan predicted (`Decision.decode_s`; 0 = no priced plan).
    """

    batch_size: int
    gamma: int
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()
    draft_rows: int = 0
    round_seconds: float = 0.0
    prefill_tokens: int = 0
    catch_up_tokens: int = 0
    prefill_rows: int = 0
    planned_seconds: float = 0.0
    waited_rows: int = 0
    waited_seconds: float = 0.0
    decode_seconds: float = 0.0

    @classmethod
    def from_rows(cls, asked: list[int], drafted: list[int], accepted: list[int], draft_s: float,
                  verify_s: float, round_s: float = 0.0, prefill: tuple[int, int] = (0, 0),
                  catch_up_tokens: int = 0, planned_s: float = 0.0,
                  waits: tuple[int, float, float] = (0, 0.0, 0.0)) -> "RoundSample":
        """A batched round's measurements from each row's asked γ, drafted and accepted counts;
        prefill: (rows in their first round, their prompts' tokens); waits: (waited_rows,
        waited_seconds, decode_seconds)."""
        longest = max(drafted, default=0)
        per_drafted = [sum(1 for d in drafted if d > i) for i in range(longest)]
        per_accepted = [sum(1 for a in accepted if a > i) for i in range(longest)]
        return cls(len(drafted), max(asked, default=0), sum(drafted), sum(accepted), draft_s, verify_s,
                   tuple(per_accepted), tuple(per_drafted), sum(1 for g in asked if g > 0), round_s, prefill[1],
                   catch_up_tokens, prefill[0], planned_s, *waits)

    @property
    def shape(self) -> RoundShape:
        draft_rows = self.draft_rows if self.draft_rows or not self.gamma else self.batch_size
        return RoundShape(self.batch_size, self.drafted + self.batch_size + self.prefill_tokens, draft_rows, self.gamma,
                          self.catch_up_tokens, self.prefill_rows, self.prefill_tokens)


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
        round_s = sample.round_seconds or sample.draft_seconds + sample.verify_seconds
        add_round_timing(self.add, sample.shape, sample.verify_seconds, sample.draft_seconds, round_s,
                         sample.planned_seconds)
        add_row_waits(self.add, sample.waited_rows, sample.waited_seconds, sample.decode_seconds)

    def merge(self, other: "StatsWindow | dict[str, float]") -> None:
        items = other.sums.items() if isinstance(other, StatsWindow) else other.items()
        for key, value in items:
            self.add(key, float(value))

    def get(self, key: str) -> float:
        return self.sums.get(key, 0.0)

    def deployment(self) -> "StatsWindow":
        """The sums that describe the deployment alone (`is_deployment_key`: round costs and
        acceptance; a store keeps them over the cost window)."""
        return StatsWindow(defaultdict(float, {k: v for k, v in self.sums.items() if is_deployment_key(k)}))


@dataclass(frozen=True)
class LoadSnapshot:
    """The cluster-wide picture the policy decides from."""

    qps: float
    in_flight: float
    queued: float
    alpha: float | None  # None when nothing was drafted in the cost window
    alpha_per_position: tuple[float, ...]  # P(first i + 1 accepted), positions drafted >= MIN_POSITION_SAMPLES times
    mean_accepted_length: float | None  # (accepted + sequence rounds) / sequence rounds; None = no rounds
    round_cost: RoundCostModel | None  # None until both target and proposer were timed
    measured_at: float
    drafted: float = 0.0  # tokens drafted in the cost window (all replicas)
    draft_calls: float = 0.0  # proposer calls timed in the cost window
    mean_batch: float = 0.0  # rows per round over the load window (all replicas; 0 = no round)
    token_rate: float = 0.0  # tokens emitted per second over the load window (all replicas): the demand met
    replicas: int = 1  # router replicas whose load gauges are alive (each decodes its own batch)

    @classmethod
    def from_window(
        cls, window: StatsWindow, window_s: float, in_flight: float, queued: float, measured_at: float,
        deployment: StatsWindow | None = None, replicas: int = 1,
    ) -> "LoadSnapshot":
        """QPS, the batch and the tokens emitted from `window` (the last window_s seconds;
        each row of a round emits its accepted tokens and one more); acceptance and the
        round cost model from `deployment` (the sums of the longer cost window; None =
        `window`'s own)."""
        lasting = window if deployment is None else deployment
        drafted = lasting.get("drafted")
        positions = []
        i = 0
        while lasting.get(f"drafted_pos:{i}") >= MIN_POSITION_SAMPLES:  # rarer positions: extrapolated
            positions.append(lasting.get(f"accepted_pos:{i}") / lasting.get(f"drafted_pos:{i}"))
            i += 1
        rows = lasting.get("sequence_rounds")
        return cls(
            qps=window.get("arrivals") / window_s if window_s > 0 else 0.0,
            in_flight=in_flight,
            queued=queued,
            alpha=lasting.get("accepted") / drafted if drafted > 0 else None,
            alpha_per_position=tuple(positions),
            mean_accepted_length=(lasting.get("accepted") + rows) / rows if rows else None,
            round_cost=RoundCostModel.from_sums(lasting.sums),
            measured_at=measured_at,
            drafted=drafted,
            draft_calls=lasting.get("draft:n"),
            mean_batch=window.get("sequence_rounds") / window.get("rounds") if window.get("rounds") else 0.0,
            token_rate=(window.get("accepted") + window.get("sequence_rounds")) / window_s if window_s > 0 else 0.0,
            replicas=max(1, replicas),
        )
