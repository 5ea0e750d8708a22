"""The speculation decision: each row's γ this round, by goodput, with per-request overrides.

The objective (`specdec.policy.gamma`, stated there): the most tokens/s whose predicted
per-token time meets every running row's TPOT target (its own, else the server's
`tpot_target_s`; none: tokens/s alone).

Pure code: it reads a `LoadSnapshot` (cluster-wide measurements, from any store) and the
rows of the round, and answers "which γ for each row?" (`specdec.policy.gamma.plan_gammas`).
Speculation turns off under load because the measured costs say so: at a large batch the
verify forward grows with every drafted token, and γ = 0 for every row is the plan.

On top of the plan:
* requests that fix their γ (mode ON, an explicit γ, mode OFF) keep it, and weigh in the round's cost;
* an on/off state, moved in the background (`update_switch`), not per round: it follows
  the plan for fresh requests at the batch the demand keeps in flight (`steady_rows`),
  with hysteresis (speculation comes back only when it gains at least `min_gain`) and a
  dwell time (`min_dwell_s`); an operator may instead force it by load thresholds
  (`LoadThresholds`: QPS and requests in flight). While it is off, requests the policy
  chooses for decode plainly. While it is on, the state decides within the cost model's
  error: a round of no more rows than the state was judged at (`judged_rows`, while
  nothing queues) speculates unless plain decoding is predicted `min_gain` faster (with
  TPOT targets: the plan with the most tokens/s, i.e. the lowest TPOT for rows alike); a
  burst of more rows, or any round while requests queue, only for a gain of `min_gain`;
* acceptance and the draft's cost, once measured, are remembered: while speculation is
  off the window holds few drafts, and the on/off state and the crossover then use the
  last measured values (the models did not change) instead of forgetting them;
* while the window holds too few drafts, at most once every `explore_interval_s` seconds
  a few rows draft anyway (one shared draft call, γ cycling 1 … explore_gamma), so those
  values stay fresh. Paced by time, not rounds: an exploration round is slower than a
  plain one (the draft catches up on the rows' histories), and under load rounds are
  many, so a per-round share of them would show in every request's tail latency;
* stale or missing measurements (nothing measured yet) fall back to a configured safe γ.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from specdec.policy.gamma import crossover_rows, plan_gammas, speculation_pays
from specdec.policy.prefix_acceptance import expected_accepted, extend_prefix_acceptance, row_prefix_acceptance
from specdec.policy.load_stats import LoadSnapshot, RoundSample
from specdec.policy.ahead_plan import taken_ahead
from specdec.policy.catch_up_reads import CatchUpReads
from specdec.policy.load_switch import LoadSwitch
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.row_state import RowState
from specdec.requests.speculation_mode import SpeculationMode, own_gamma

ENOUGH_DRAFT_CALLS, ENOUGH_DRAFTED = 8, 64  # a window with fewer needs exploration


@dataclass(frozen=True)
class Decision:
    gamma: int  # the largest γ the plan gave a policy-chosen row (0 = speculation off; exploration not counted)
    enabled: bool  # the on/off state (the operator's switch, or the plan's)
    reason: str  # why, for status displays and logs
    gammas: tuple[int, ...] = ()  # each row's γ this round, in the order of the rows
    planned_s: float = 0.0  # the plan's round as the cost model's parts predict it (0 = not a priced plan)
    decode_s: float = 0.0  # its decoding round (calibrated, no prompts), what rows' waits are set against (0 = none)
    catch_up: tuple[float, ...] = ()  # a goodput plan's catch-up per row as priced (amortised); () = not one
    extra_read: float = 0.0  # of each catch-up: the tokens a drafting row reads beyond its own (`CatchUpReads`)


@dataclass(frozen=True)
class Crossover:
    """Where speculation stops paying on this deployment (from the cost model)."""

    rows: int | None  # rows per round at which the plan turns speculation off (None: never up to 256)
    qps: float | None  # requests/s whose tokens keep that many rows in flight on every replica (Little's law)


def amortised_catch_up(curves: np.ndarray, rows: list[RowState], hi: list[int]) -> list[float]:
    """Each row's catch-up spread over the rounds it has left while drafting: the draft reads
    a row's history once, and every later round of that row drafts without it. Charged to
    one round, a row that decoded plainly for a while would look ever dearer to draft for,
    the longer it waited. Rounds left: its remaining tokens over what a round of its
    largest γ emits (unknown remaining tokens: one round). curves: # [rows, gamma_max]"""
    if not rows:
        return []
    top = np.clip(np.asarray(hi), 1, curves.shape[1])  # [rows]
    per_round = 1.0 + np.cumsum(curves, axis=1)[np.arange(len(rows)), top - 1]  # [rows]
    remaining = np.array([row.remaining_tokens for row in rows], dtype=np.float64)
    catch_up = np.array([row.catch_up_tokens for row in rows], dtype=np.float64)
    return (catch_up / np.maximum(1.0, remaining / per_round)).tolist()


def fixed_plan(asks: list[tuple[SpeculationMode, int | None]], default_gamma: int) -> Decision:
    """The plan without a policy: every row its own γ (`own_gamma`, speculating whenever the
    server's γ is not 0), else the server's. asks: each row's (mode, requested γ)."""
    gammas = []
    for mode, requested in asks:
        own = own_gamma(mode, requested, default_gamma, default_gamma > 0)
        gammas.append(default_gamma if own is None else own)
    return Decision(default_gamma, default_gamma > 0, "static γ", tuple(gammas))


class RoundPolicy(Protocol):
    """Plans each round's γ per row (e.g. a LoadMonitor over a SpeculationPolicy) and hears
    the load and what each round cost."""

    def on_arrival(self, count: int = 1) -> None: ...

    def set_load(self, in_flight: int, queued: int) -> None: ...

    def plan(self, rows: list[RowState], default_gamma: int) -> Decision: ...

    # optional (`LoadMonitor`): plan_ahead(rows, default_gamma) -> Decision, the plan for these
    # rows counting no round, computed while the target verifies; plan(rows, default_gamma,
    # ahead=that plan) then takes it for the next round (`SpeculationPolicy.plan`)

    def record(self, sample: RoundSample) -> None: ...


class SpeculationPolicy:
    """Plans each round's γ from the latest snapshot; keeps the on/off state (hysteresis, dwell)."""

    def __init__(self, settings: PolicySettings) -> None:
        if not 0 <= settings.fallback_gamma <= settings.gamma_max:
            raise ValueError(
                f"fallback_gamma ({settings.fallback_gamma}) must be in [0, gamma_max={settings.gamma_max}]"
            )
        self.settings = settings
        dwell = settings.thresholds.min_dwell_s if settings.thresholds else settings.min_dwell_s
        self.switch = LoadSwitch(settings.thresholds, dwell)
        self.explorations = 0  # exploration rounds so far (γ cycles with them)
        self._explored_at: float | None = None
        self._measured: LoadSnapshot | None = None  # the last snapshot with acceptance and a cost model
        self.judged_rows = 0  # the batch the on/off state was last judged at, nothing queued (0: none)
        self.reads = CatchUpReads()  # what drafting rows read beyond their charged catch-up

    def update_switch(self, snapshot: LoadSnapshot | None, running: int, now: float) -> bool:
        """Move the on/off state (in the background, not per round). The operator's override
        follows its QPS / in-flight thresholds; otherwise the state follows the plan for
        `running` fresh requests (at least one; the load monitor passes `steady_rows`, or
        the window's mean rows per round while requests queue): on while speculating pays
        at that batch (each drafting row reading what drafting rows read beyond their own
        catch-up, `CatchUpReads`: while it is on, the draft also reads the prompts of the rows
        it plans plainly), back on only when it gains min_gain (hysteresis), never sooner than
        min_dwell_s after the last change. While nothing queues, rounds of up to `running`
        rows then speculate within min_gain of plain decoding (`plan`)."""
        if snapshot is None:
            return self.switch.enabled
        if self.settings.thresholds is not None:
            return self.switch.update(snapshot.qps, snapshot.in_flight + snapshot.queued, now)
        snapshot = self.remembered(snapshot)
        if snapshot.alpha is None or snapshot.round_cost is None:
            return self.switch.enabled
        rows = max(1, running)
        self.judged_rows = rows if snapshot.queued <= 0 else 0
        margin = 0.0 if self.switch.enabled else self.settings.min_gain
        pays = speculation_pays(self._cluster_curve(snapshot), snapshot.round_cost, self.settings.gamma_max,
                                rows, margin, self.settings.max_round_ratio, self.settings.tpot_target_s,
                                self.reads.extra())
        self.switch.set(pays, now)
        return self.switch.enabled

    def steady_rows(self, snapshot: LoadSnapshot) -> int | None:
        """The batch the on/off state is judged at: the rows plain decoding would keep in
        flight on one replica at the load window's demand (tokens emitted per second over
        the replicas; `RoundCostModel.plain_rows_for`). Speculation gains less the larger the
        batch, so both policies' steady batches lie on the same side of the crossover, and
        the one below it streams faster (mean ITL = rows / demand). Unlike the batch now, the
        demand does not depend on which policy serves it: a burst does not switch speculation
        off, nor a lull back on into the next burst (a window's mean batch near the crossover
        swings across it with the bursts of Poisson arrivals, and a state judged at it flaps).
        None: no cost model yet, or plain decoding would not keep up."""
        cost = self.remembered(snapshot).round_cost
        if cost is None:
            return None
        rows = cost.plain_rows_for(snapshot.token_rate / max(1, snapshot.replicas))
        return max(1, round(rows)) if np.isfinite(rows) else None

    def plan(self, snapshot: LoadSnapshot | None, rows: list[RowState], now: float, default_gamma: int,
             update_state: bool = True, ahead: Decision | None = None) -> Decision:
        """Each row's γ this round (request overrides, the on/off state, the goodput plan,
        exploration). update_state=False previews it without counting a round (status, a
        plan made ahead). ahead: the goodput plan made for these rows (in their order) while
        the last round verified (`RoundPlanner`): taken instead of planning again where
        speculation is still on; everything else about the round (overrides, caps,
        exploration, its predicted seconds) is this round's own."""
        s = self.settings
        fixed = [own_gamma(row.mode, row.requested_gamma, default_gamma, self.switch.enabled) for row in rows]
        free = [i for i, f in enumerate(fixed) if f is None]
        lo = [min(f, row.cap) if f is not None else 0 for f, row in zip(fixed, rows)]
        hi = [min(s.gamma_max, row.cap) if f is None else lo_i for f, row, lo_i in zip(fixed, rows, lo)]
        if snapshot is None or now - snapshot.measured_at > s.stale_after_s:
            return self._fallback(lo, hi, free, "no fresh measurements: fallback γ")
        explore = update_state and self._explore_now(snapshot, now)
        snapshot = self.remembered(snapshot)
        measured = snapshot.alpha is not None and snapshot.round_cost is not None
        if self.switch.enabled and not measured:
            return self._fallback(lo, hi, free, "acceptance or cost not measured yet: fallback γ")
        if not free:  # every row's γ is its request's: nothing to plan on the round's critical path
            return self._priced(self._decision(lo, free, rows, self.switch.enabled, "every row's γ is its request's"),
                                snapshot, rows, explore, [float(r.catch_up_tokens) for r in rows])
        if not self.switch.enabled:  # stays off while measurements thin out (exploration only)
            if s.thresholds is not None:
                reason = f"load high (qps {snapshot.qps:.1f}, in flight {snapshot.in_flight:.0f}): switched off"
            else:
                reason = f"off: speculating does not pay at {_counted(len(rows), 'row')}"
            return self._priced(self._decision(lo, free, rows, False, reason, explore), snapshot, rows, explore,
                                [0.0] * len(rows))
        if ahead is not None and ahead.enabled and len(ahead.catch_up) == len(rows) == len(ahead.gammas):
            (gammas, catch_up), reason, extra = taken_ahead(ahead, rows, fixed, lo, hi), ahead.reason, ahead.extra_read
        else:
            gammas, catch_up, reason, extra = self._goodput_plan(snapshot, rows, fixed, lo, hi)
        decision = replace(self._decision(gammas, free, rows, True, reason, explore), catch_up=tuple(catch_up),
                           extra_read=extra)
        if update_state and not explore:  # a plan's rows read all their catch-up where they draft
            self.reads.record(decision.gammas, [row.catch_up_tokens for row in rows],
                              [c - decision.extra_read for c in decision.catch_up])
        return self._priced(decision, snapshot, rows, explore, list(decision.catch_up))

    def _goodput_plan(self, snapshot: LoadSnapshot, rows: list[RowState], fixed: list[int | None], lo: list[int],
                      hi: list[int]) -> tuple[list[int], list[float], str, float]:
        """The goodput plan (`plan_gammas`) for a round while speculation is on: each row's γ
        (its request's own where it fixes one), its catch-up as priced (amortised, and what
        drafting rows read beyond it: `CatchUpReads`), the reason, and that extra read."""
        s = self.settings
        curves = self._curves(snapshot, rows)
        targets = self._targets(rows)
        margin = self._margin(len(rows), targets)
        # a request's own γ may exceed gamma_max (up to speculation.gamma_max): the plan prices
        # that row at gamma_max and the row keeps its γ (its neighbours are still planned)
        extra = self.reads.extra()
        catch_up = [c + extra for c in amortised_catch_up(curves, rows, hi)]
        plan = plan_gammas(curves, [min(x, s.gamma_max) for x in lo], [min(x, s.gamma_max) for x in hi],
                           snapshot.round_cost, margin, max_round_ratio=s.max_round_ratio,
                           prompt_tokens=sum(r.prompt_tokens for r in rows), catch_up=catch_up,
                           tpot_targets_s=targets)
        gammas = [g if f is None else own for g, f, own in zip(plan.gammas, fixed, lo)]
        missed = f", TPOT targets missed by {plan.tpot_excess:.2f}x (worst row)" if plan.tpot_excess > 1 else ""
        waits = f", rows wait {snapshot.round_cost.wait_scale:.2f}x the decoding round" if targets else ""
        trimmed = (f", {plan.reach_goodput:.0f} untrimmed: the trust region allows "
                   f"{snapshot.round_cost.drafted_limit(len(rows)):.0f} drafts") if plan.reach_goodput else ""
        reads = f", drafting rows read {_counted(round(extra), 'token')} more" if extra >= 0.5 else ""
        reason = (f"goodput plan: {plan.goodput:.0f} vs {plan.plain_goodput:.0f} tokens/s plain "
                  f"(α {snapshot.alpha:.2f}, {_counted(len(rows), 'row')}{waits}{missed}{trimmed}{reads})")
        return gammas, catch_up, reason, extra

    def _margin(self, rows: int, targets: list[float] | None) -> float:
        """What a speculating plan must gain over plain decoding this round (`plan_gammas`):
        min_gain, except in a round of no more rows than the on/off state was judged at.
        There, without targets, the state decides within the cost model's error (−min_gain:
        speculation stays on unless plain decoding is predicted min_gain faster); with TPOT
        targets the objective decides alone (0): for rows alike the plan with the most
        tokens/s is the one with the lowest TPOT, and leaning either way lengthens every
        row's time per token by up to min_gain, which moves a target in the middle of the
        TPOT distribution by far more in attainment. The on/off state keeps its hysteresis
        (`update_switch`); a row that resumes drafting pays its catch-up (`plan_gammas`),
        so rounds do not flap between the two for nothing."""
        if rows > self.judged_rows:
            return self.settings.min_gain
        return 0.0 if targets is not None else -self.settings.min_gain

    @staticmethod
    def _priced(decision: Decision, snapshot: LoadSnapshot, rows: list[RowState], explore: bool,
                catch_up: list[float]) -> Decision:
        """The decision with its round's predicted seconds (`RoundCostModel.base_round_s`), so
        that what the round then takes calibrates the model, and its decoding round as the
        TPOT prediction priced it (catch_up: as the plan spread it), so that what its rows
        wait calibrates that (`RoundCostModel.wait_scale`); exploration rounds are not plans
        (a few rows drafting after a pause) and are not priced."""
        cost = snapshot.round_cost
        if explore or cost is None:
            return decision
        planned_s = cost.base_round_s(decision.gammas, sum(r.prompt_tokens for r in rows),
                                      [r.catch_up_tokens for r in rows])
        return replace(decision, planned_s=planned_s, decode_s=cost.round_s(decision.gammas, 0, catch_up))

    def crossover(self, snapshot: LoadSnapshot | None) -> Crossover:
        """Rows per round (and requests/s) beyond which speculation does not pay, for a row
        with the cluster's acceptance; unknown until acceptance and costs are measured."""
        snapshot = self.remembered(snapshot) if snapshot is not None else None
        if snapshot is None or snapshot.alpha is None or snapshot.round_cost is None or not self.settings.gamma_max:
            return Crossover(None, None)
        rows = crossover_rows(self._cluster_curve(snapshot), snapshot.round_cost, self.settings.gamma_max,
                              max_round_ratio=self.settings.max_round_ratio, margin=self.settings.min_gain,
                              tpot_target_s=self.settings.tpot_target_s, catch_up=self.reads.extra())
        if rows is None or snapshot.qps <= 0 or snapshot.token_rate <= 0:
            return Crossover(rows, None)
        demand = rows / snapshot.round_cost.round_s([0] * rows) * max(1, snapshot.replicas)  # tokens/s (Little's law)
        return Crossover(rows, demand / (snapshot.token_rate / snapshot.qps))  # over the tokens per request emitted

    def remembered(self, snapshot: LoadSnapshot) -> LoadSnapshot:
        """The snapshot, with acceptance and the cost model from the last one that measured
        them where its window holds too few drafts (speculation off: exploration only; a
        pause in the traffic). A thin window (fewer than ENOUGH_DRAFTED drafted tokens or
        ENOUGH_DRAFT_CALLS calls) does not measure acceptance, its few drafts are a coin
        toss: they only move the remembered α by their count (the remembered one weighs as
        ENOUGH_DRAFTED tokens), and the remembered per-position curve stands. A thin window's
        cost model keeps its plain-round prices and takes the remembered model's prices of
        drafting and trust region (`RoundCostModel.with_drafting_of`): fitted on a few
        exploration calls (one row, a worker woken from idle, a long catch-up) and a window of
        plain rounds (the trust region shrinks to their forwards), the plan would find no γ
        that pays where drafting does pay, and speculation would stay off. An error that keeps
        speculation on is measured and corrected by the rounds it drafts; one that keeps it off
        is never measured again."""
        thin = self._needs_measurements(snapshot)
        if snapshot.alpha is not None and snapshot.round_cost is not None and not thin:
            self._measured = snapshot
            return snapshot
        if self._measured is None:
            return snapshot
        last = self._measured
        alpha, positions = last.alpha, last.alpha_per_position
        if snapshot.alpha is not None and not thin:  # acceptance measured, the cost model not yet
            alpha, positions = snapshot.alpha, snapshot.alpha_per_position
        elif snapshot.alpha is not None and snapshot.drafted > 0:
            alpha = ((snapshot.alpha * snapshot.drafted + last.alpha * ENOUGH_DRAFTED)
                     / (snapshot.drafted + ENOUGH_DRAFTED))
        cost = snapshot.round_cost
        if cost is None:
            cost = last.round_cost
        elif thin:  # plain rounds re-measured; drafting as it was last measured
            cost = cost.with_drafting_of(last.round_cost)
        return replace(snapshot, alpha=alpha, alpha_per_position=positions, round_cost=cost)

    def _targets(self, rows: list[RowState]) -> list[float] | None:
        """Each row's TPOT target, seconds: its own, else the server's, else none (inf);
        None when no row has one (the plan is then the tokens/s maximum alone)."""
        default = self.settings.tpot_target_s
        targets = [row.tpot_target_s if row.tpot_target_s is not None else default for row in rows]
        if all(t is None for t in targets):
            return None
        return [float("inf") if t is None else t for t in targets]

    def _curves(self, snapshot: LoadSnapshot, rows: list[RowState]) -> np.ndarray:
        """P(first k accepted) per row, k = 1 … gamma_max: each row's accepted tokens against
        what the cluster's acceptance expected of its drafts, position by position (drafts
        at the cluster's mean positions where a row does not say where). One batched
        computation for all rows: it runs on every round's critical path. # [rows, gamma_max]"""
        cluster = self._cluster_curve(snapshot)
        if not rows:
            return np.zeros((0, len(cluster)))
        drafted = np.array([row.drafted for row in rows], dtype=np.float64)  # [rows]
        accepted = np.array([row.accepted for row in rows], dtype=np.float64)  # [rows]
        positions = max(len(row.drafted_per_position) for row in rows)
        offered = np.zeros((len(rows), positions))  # [rows, positions], zero-padded
        for i, row in enumerate(rows):
            offered[i, : len(row.drafted_per_position)] = row.drafted_per_position
        located = np.array([bool(row.drafted_per_position) for row in rows])  # [rows]
        expected = np.where(located, expected_accepted(cluster, offered), drafted * snapshot.alpha)
        return row_prefix_acceptance(cluster, snapshot.alpha, drafted, accepted, self.settings.prior_tokens, expected)

    def _cluster_curve(self, snapshot: LoadSnapshot) -> np.ndarray:
        """The cluster's P(first k accepted), k = 1 … gamma_max (geometric in α where no
        position was drafted often enough). # [gamma_max]"""
        width = max(1, self.settings.gamma_max)
        if snapshot.alpha_per_position:
            return extend_prefix_acceptance(snapshot.alpha_per_position, width)
        return snapshot.alpha ** np.arange(1, width + 1)

    def _fallback(self, lo: list[int], hi: list[int], free: list[int], reason: str) -> Decision:
        gammas = list(lo)
        for i in free:
            gammas[i] = min(self.settings.fallback_gamma, hi[i])
        return Decision(max((gammas[i] for i in free), default=0), self.switch.enabled, reason, tuple(gammas))

    @staticmethod
    def _needs_measurements(snapshot: LoadSnapshot) -> bool:
        """Too few drafts in the window to keep acceptance and the draft's cost measured."""
        return snapshot.draft_calls < ENOUGH_DRAFT_CALLS or snapshot.drafted < ENOUGH_DRAFTED

    def _explore_now(self, snapshot: LoadSnapshot, now: float) -> bool:
        """True when this round explores: the window is short of drafts and the last
        exploration was at least explore_interval_s ago."""
        interval = self.settings.explore_interval_s
        if not interval or not self._needs_measurements(snapshot):
            return False
        if self._explored_at is not None and now - self._explored_at < interval:
            return False
        self._explored_at = now
        self.explorations += 1
        return True

    def _decision(self, gammas: list[int], free: list[int], rows: list[RowState], enabled: bool, reason: str,
                  explore: bool = False) -> Decision:
        """The decision; on exploration rounds the first few free rows at γ = 0 (the oldest:
        the same ones each time, so the draft only catches up on the tokens since their last
        exploration, not on whole histories) draft anyway, with γ cycling 1 … explore_gamma
        so the draft's cost is measured at several γ."""
        s = self.settings
        planned = max((gammas[i] for i in free), default=0)
        if explore:
            idle = [i for i in free if gammas[i] == 0 and rows[i].cap > 0]
            gamma = 1 + (self.explorations - 1) % s.explore_gamma
            for i in idle[: s.explore_rows]:
                gammas[i] = min(gamma, rows[i].cap, s.gamma_max)
        return Decision(planned, enabled, reason, tuple(gammas))


def _counted(count: int, noun: str) -> str:
    """'1 row', '3 rows': a count in a reason an operator reads."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
