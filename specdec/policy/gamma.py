"""γ per row, per round: the policy's objective, stated here once.

**Objective.** Maximise the batch's expected emitted tokens per second subject to each row's
time-per-output-token (TPOT) target: goodput as serving systems define it (DistServe, OSDI
2024: the rate of requests that meet their latency targets). Among the plans priced below,
the plan is the one with the most tokens/s among those that keep the most rows within their
targets (counted as each row's chance of landing within, `_expected_within`; plans within
TIED_ROWS of the most are tied); a speculating plan tied with plain decoding must beat its
tokens/s by the error band; rows without a target meet any. A row that misses its
target in every plan does not hold its neighbours back: judged by its worst row, an
unlucky row (its drafts rejected, so a longer round only lengthens its TPOT) kept whole
batches plain under load where drafting met more targets and streamed faster. A row's
predicted TPOT under a plan is what the row waits per round over the tokens it emits:
wait_scale · round_s(γ) / E_i(γ_i), round_s the round's decoding seconds and wait_scale
the measured seconds between a row's emissions over the decoding rounds its plans predicted
(`RoundCostModel.wait_scale`: the prompt rounds interleaved with decoding, rounds a row sits
out, the engine between rounds). Judged on the decoding round alone, a plan met the target
on paper and its rows missed it: the constraint then trimmed the other rows' γ for a row it
could not save. Without targets the constraint is void and the plan is the tokens/s
maximum alone. Prompts read in the round are left out of the tokens/s: that time is the
same whatever the plan. (At one batch, rows alike have TPOT = rows / tokens/s, so the target decides
only where rows differ: a row that decodes plainly pays for its neighbours' drafts.)

Row i drafting γ_i tokens emits on average E_i(γ_i) = 1 + Σ_{k ≤ γ_i} P_i(k) tokens, where
P_i(k) is the probability that its first k drafted tokens are all accepted (the cluster's
measured per-position acceptance, scaled by the row's own acceptance so far, shrunk towards
the cluster's while the row has drafted little: `specdec.policy.prefix_acceptance`). A round
costs `RoundCostModel.round_s(γ)` seconds. Unconstrained (no targets), the plan maximises

    goodput(γ) = Σ_i E_i(γ_i) / round_s(γ)        over lo_i ≤ γ_i ≤ hi_i

Rows with a fixed γ (mode ON, an explicit γ, mode OFF) have lo = hi: they
are not chosen but still weigh in the cost. For each possible number of draft steps g (the
largest γ), the cost is a constant plus a sum of per-row terms, so the ratio is maximised
by Dinkelbach's iteration: with λ the current goodput, each row independently maximises
E_i(γ) − λ · cost_i(γ), then λ is updated, until the choice repeats. γ = 0 for every row —
plain decoding — is what the plan chooses when drafting costs more than it emits (a poor
proposer, or a large batch whose verify forward is compute-bound). The plans priced are
plain decoding and, for each number of draft steps, that iteration's choice (within the
round-time bound below); the TPOT targets choose among them, and the one chosen is then
trimmed to the cost model's trust region (`plan_gammas`).

Goodput is a mean; the latency tail is the round whose first draft is rejected: every row
then gets one token for the whole round, the draft's steps included. Plain decoding has a
tail too: its rounds that read a newcomer's prompt. `max_round_ratio` bounds a plan's
predicted round at that many times such a round of the same batch decoded plainly (its
rows at their least γ, reading this round's prompts or, when they are shorter, one
newcomer's mean prompt: `RoundCostModel.prefill_round_s`), so speculation cannot stretch
the gap between two tokens, in any row, past the gaps plain decoding has anyway. Plans
over the bound lose their least likely drafts until they fit: at 1.0 a round that
prefills a typical prompt drafts nothing, and the other rounds draft what fits in the
time a prefill round would take.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from specdec.policy.round_cost import RoundCostModel

# A request's TPOT around its row's predicted mean, one standard deviation relative to it
# (docs/goodput.md, measured): a row that decodes plainly scatters by the prediction's own
# error; a drafting row's tokens per round are its drafts' luck as well, a variance that
# grows with every token it drafts: sqrt(TPOT_SCATTER² + TPOT_SCATTER_PER_DRAFT² · γ_i).
TPOT_SCATTER = 0.04
TPOT_SCATTER_PER_DRAFT = 0.11
TIED_ROWS = 0.5  # plans whose expected rows within their targets differ by less are tied: tokens/s decides


@dataclass(frozen=True)
class Plan:
    gammas: tuple[int, ...]  # each row's γ this round
    goodput: float  # predicted emitted tokens per second
    plain_goodput: float  # the same with every free row at its least γ (speculation off)
    tpot_excess: float = 0.0  # the worst row's predicted TPOT over its target (<= 1: all met; 0: no targets)
    reach_goodput: float = 0.0  # the plan it was judged on, before the trust region trimmed it (0: not trimmed)


@dataclass(frozen=True)
class _Candidate:
    """One number of draft steps' plan: judged untrimmed by the trust region (`reach`), taken
    trimmed to it (`step`)."""

    reach: tuple[int, ...]
    step: tuple[int, ...]
    value: float  # the reach's predicted tokens/s
    met: float  # rows expected within their TPOT targets under the reach (`_expected_within`)


def plan_gammas(
    curves: np.ndarray, lo: list[int], hi: list[int], cost: RoundCostModel, margin: float = 0.0,
    max_round_ratio: float = 0.0, prompt_tokens: int = 0, catch_up: list[int] | None = None,
    tpot_targets_s: ArrayLike | None = None,
) -> Plan:
    """The goodput-maximising γ per row within the rows' TPOT targets (the module's
    objective; ties go to fewer draft steps). A plan that speculates
    more than the rows' least γ must beat that plain plan by `margin` (a fraction), so that
    noise in the measurements does not switch speculation on for nothing (a negative margin:
    it may fall short of it by that much, so that speculation goes on within the cost
    model's error; `SpeculationPolicy.plan`), and its round may
    take at most `max_round_ratio` times the plain plan's with a newcomer's prompt
    (`RoundCostModel.prefill_round_s`; 0 = unbounded).
    The trust region (`RoundCostModel.drafted_limit`) bounds what the plan drafts, not the
    decision: plans are judged (margin, targets, tokens/s) as the cost model prices them
    untrimmed, and the one chosen is then trimmed to the region, a step inside it. Judged
    trimmed, a region left narrow by plain rounds (32 rows of plain decoding cover about 15
    drafted tokens) let no plan clear the margin where speculating pays, so nothing drafted
    and the region never grew: AUTO stayed plain after plain periods. Each step's rounds
    widen the region (by a quarter per EDGE_ROUNDS rounds), and the fit corrects itself on
    them where the untrimmed price was wrong.
    prompt_tokens: what the target reads this round besides the rows' γ + 1 tokens: read
    whatever the plan, its time is sunk, so goodput is that of the rows' decoding alone
    (counted in the round's own ratio, a prompt lowers plain decoding's goodput more than
    drafting's, and the plan would draft in the rounds that are long already); it counts
    towards the round-time bound only;
    catch_up: what the proposer reads of each row's history before drafting for it (None: 0).
    tpot_targets_s: each row's time-per-output-token target, seconds (inf = none; None: no
    row has one). The margin still chooses between plain decoding and a plan that speculates
    where both meet every target, or where neither does and both meet as many (for rows
    alike, under a target no plan meets, the same test as without one).
    curves: # [rows, gamma_max] P_i(k), k = 1 … gamma_max; lo, hi: each row's bounds."""
    rows = len(lo)
    read, lo_a, hi_a = _bounds(curves, lo, hi, catch_up)
    if rows == 0:
        return Plan((), 0.0, 0.0)
    emitted = np.concatenate([np.ones((rows, 1)), 1.0 + np.cumsum(curves, axis=1)], axis=1)  # [rows, gamma_max + 1]
    plain = tuple(int(x) for x in lo_a)
    read_list = read.tolist()  # round_s sums it per call: plain floats, not numpy scalars
    seconds = lru_cache(maxsize=None)(lambda gammas: cost.round_s(gammas, 0, read_list))  # each plan priced once
    waits = lambda gammas: cost.wait_scale * seconds(gammas)  # noqa: E731  (`row_wait_s`: per round, as rows see it)
    ratios = _tpot_ratios(emitted, waits, tpot_targets_s, rows)
    plain_goodput = _goodput(emitted, plain, seconds)
    candidates = _candidates(emitted, lo_a, hi_a, cost, read, seconds, ratios,
                             _time_bound(cost, plain, prompt_tokens, read_list, max_round_ratio))
    plain_within = ratios(plain)
    best = _chosen(candidates, plain, _expected_within(plain_within, plain), plain_goodput, margin)
    if best is None:
        return Plan(plain, plain_goodput, plain_goodput, _worst(plain_within))
    return _taken(best, emitted, seconds, ratios, plain_goodput)


def _bounds(curves: np.ndarray, lo: list[int], hi: list[int],
            catch_up: list[int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's catch-up, least and largest γ as arrays (the largest within the curves),
    checked. # [rows] each"""
    rows = len(lo)
    read = np.zeros(rows) if catch_up is None else np.asarray(catch_up, dtype=np.float64)  # [rows]
    assert read.shape == (rows,), (read.shape, rows)
    assert curves.ndim == 2 and curves.shape[0] == rows == len(hi), (curves.shape, len(lo), len(hi))
    lo_a, hi_a = np.asarray(lo), np.minimum(np.asarray(hi), curves.shape[1])
    if (lo_a > hi_a).any() or (lo_a < 0).any():
        raise ValueError(f"need 0 <= lo <= hi <= {curves.shape[1]}, got lo={lo}, hi={hi}")
    return read, lo_a, hi_a


def _chosen(candidates: list[_Candidate], plain: tuple[int, ...], plain_met: float, plain_goodput: float,
            margin: float) -> _Candidate | None:
    """The speculating plan taken, or None for plain decoding: the most tokens/s among the
    plans that keep as many rows within their targets as any, to within TIED_ROWS; one tied
    with plain decoding must beat it by `margin`."""
    speculating = [c for c in candidates if c.reach != plain]
    top = max([plain_met, *(c.met for c in speculating)])
    best = _first_best([c for c in speculating if c.met >= top - TIED_ROWS], lambda c: 0)
    if best is None or (plain_met >= top - TIED_ROWS and best.value <= plain_goodput * (1.0 + margin)):
        return None
    return best


def _time_bound(cost: RoundCostModel, plain: tuple[int, ...], prompt_tokens: int, read: list[float],
                max_round_ratio: float) -> Callable[[np.ndarray, tuple[int, ...]], tuple[int, ...]]:
    """The round-time bound as a trim: a plan over `max_round_ratio` times the plain plan's
    round with a newcomer's prompt loses its least likely drafts until it fits (identity
    when unbounded)."""
    if max_round_ratio <= 0:
        return lambda emitted, gammas: gammas
    slowest = cost.prefill_round_s(plain, prompt_tokens) * max_round_ratio
    whole_round = lambda gammas: cost.round_s(gammas, prompt_tokens, read)  # noqa: E731
    lo = np.asarray(plain)
    return lambda emitted, gammas: _within_time(emitted, gammas, lo, whole_round, slowest)


def _candidates(emitted: np.ndarray, lo: np.ndarray, hi: np.ndarray, cost: RoundCostModel, read: np.ndarray,
                seconds: Callable[[tuple[int, ...]], float], ratios: Callable[[tuple[int, ...]], np.ndarray],
                bound: Callable[[np.ndarray, tuple[int, ...]], tuple[int, ...]]) -> list[_Candidate]:
    """Each number of draft steps' Dinkelbach choice within the round-time bound, judged as
    priced (`reach`) and trimmed to the trust region (`step`), until goodput has fallen twice
    in a row (past the best number of steps it only falls)."""
    rows = len(lo)
    budget = max(float(lo.sum()), cost.drafted_limit(rows))
    all_steps = np.arange(int(lo.max()) + 1, int(hi.max()) + 1)
    out: list[_Candidate] = []
    previous, falling = 0.0, 0
    for choice in _plans_for_steps(emitted, lo, hi, all_steps, cost, read):
        reach = bound(emitted, tuple(int(x) for x in choice))
        step = _within_budget(emitted, reach, lo, budget)  # trims least likely first: stays within the bound
        value = _goodput(emitted, reach, seconds)
        out.append(_Candidate(reach, step, value, _expected_within(ratios(reach), reach)))
        falling = falling + 1 if value < previous else 0
        if falling >= 2:
            break
        previous = value
    return out


def _first_best(candidates: list[_Candidate], rank: Callable[[_Candidate], int]) -> _Candidate | None:
    """The candidate of the highest rank, then tokens/s; ties (within rounding) go to the
    first, the fewer draft steps."""
    best = None
    for c in candidates:
        if best is None or (rank(c), c.value) > (rank(best), best.value * (1.0 + 1e-12)):
            best = c
    return best


def _taken(chosen: _Candidate, emitted: np.ndarray, seconds: Callable[[tuple[int, ...]], float],
           ratios: Callable[[tuple[int, ...]], np.ndarray], plain_goodput: float) -> Plan:
    """The plan chosen, as taken: trimmed to the trust region (its tokens/s and TPOT as such),
    with the tokens/s it was judged on where the trim changed it."""
    if chosen.step == chosen.reach:
        return Plan(chosen.reach, chosen.value, plain_goodput, _worst(ratios(chosen.reach)))
    return Plan(chosen.step, _goodput(emitted, chosen.step, seconds), plain_goodput, _worst(ratios(chosen.step)),
                reach_goodput=chosen.value)


def _tpot_ratios(emitted: np.ndarray, wait_s: Callable[[tuple[int, ...]], float], targets_s: ArrayLike | None,
                 rows: int) -> Callable[[tuple[int, ...]], np.ndarray]:
    """Each row's predicted TPOT over its target under a plan: wait_s(γ) / E_i(γ_i) / target_i,
    wait_s what a row waits per round (0 for rows without a target: they meet any).
    emitted: # [rows, gamma_max + 1]; # [rows] back"""
    if targets_s is None or np.isinf(np.asarray(targets_s, dtype=np.float64)).all():
        return lambda gammas: np.zeros(rows)
    targets = np.asarray(targets_s, dtype=np.float64)  # [rows]
    assert targets.shape == (rows,) and (targets > 0).all(), (targets, rows)

    def ratios(gammas: tuple[int, ...]) -> np.ndarray:
        tokens = emitted[np.arange(rows), list(gammas)]  # [rows]
        return wait_s(gammas) / tokens / targets
    return ratios


def _expected_within(ratios: np.ndarray, gammas: tuple[int, ...]) -> float:
    """Rows expected within their TPOT targets, from each row's predicted TPOT over its target
    (0: none) under the plan `gammas`. A prediction is a row's mean and its TPOT scatters
    around it, so a row at 0.99x its target meets it about as often as one at 1.01x: counted
    by a hard threshold, one row crossing it chose one draft step for a whole batch over two
    that streamed more and kept the others further within, and plans flipped between the two
    round by round. Each row counts its chance of landing within: a normal scatter around
    the prediction (logistic approximation), wider the more the row drafts (its variance
    TPOT_SCATTER² + TPOT_SCATTER_PER_DRAFT² · γ_i). One scatter for every plan judged plain
    decoding's tight TPOT as loosely as a drafting row's: under a target just above plain decoding's TPOT,
    plain decoding meets it for nearly every request and drafting misses it for the requests
    whose drafts were rejected, yet a drafting plan predicted further within looked safer.
    A row without a target (ratio 0) counts whole. # ratios, gammas: [rows]"""
    ratios = np.asarray(ratios, dtype=np.float64)
    scatter = np.sqrt(TPOT_SCATTER ** 2 + TPOT_SCATTER_PER_DRAFT ** 2 * np.asarray(gammas, dtype=np.float64))
    z = (1.0 - ratios) / scatter
    chance = 1.0 / (1.0 + np.exp(-1.702 * np.clip(z, -40.0, 40.0)))
    return float(np.where(ratios > 0, chance, 1.0).sum())  # a row without a target meets any


def _worst(ratios: np.ndarray) -> float:
    """The worst row's TPOT over its target (0: no row has one)."""
    return float(ratios.max()) if ratios.size else 0.0


def _within_budget(emitted: np.ndarray, gammas: tuple[int, ...], lo: np.ndarray, budget: float) -> tuple[int, ...]:
    """Trim the plan to at most `budget` drafted tokens in all (the cost model's trust
    region), taking back the drafts least likely to be accepted (each row's last ones:
    P_i(k) does not grow with k)."""
    chosen = np.asarray(gammas)
    if chosen.sum() <= budget:
        return gammas
    excess = int(np.ceil(chosen.sum() - budget))
    drop = _least_likely_first(emitted, lo, chosen)[:excess]
    return tuple(int(x) for x in chosen - np.bincount(drop, minlength=len(chosen)))


def _within_time(emitted: np.ndarray, gammas: tuple[int, ...], lo: np.ndarray,
                 round_s: Callable[[tuple[int, ...]], float], slowest_s: float) -> tuple[int, ...]:
    """Trim the plan until its predicted round takes at most `slowest_s` seconds, taking back
    the drafts least likely to be accepted first (as `_within_budget`). The round only gets
    shorter with every draft taken back, so the fewest to take back is found by bisection."""
    if round_s(gammas) <= slowest_s:
        return gammas
    chosen = np.asarray(gammas)
    order = _least_likely_first(emitted, lo, chosen)

    def trimmed(count: int) -> tuple[int, ...]:
        return tuple(int(x) for x in chosen - np.bincount(order[:count], minlength=len(chosen)))

    low, high = 1, len(order)  # taking back all of them leaves the plain plan, which is the floor
    while low < high:
        middle = (low + high) // 2
        if round_s(trimmed(middle)) <= slowest_s:
            high = middle
        else:
            low = middle + 1
    return trimmed(low)


def _least_likely_first(emitted: np.ndarray, lo: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """The row of every drafted token of the plan above its row's least γ, the drafts least
    likely to be accepted first (P_i(k) does not grow with k: a row's last ones first)."""
    g = np.arange(emitted.shape[1])[None, :]
    rows, ks = np.nonzero((g > lo[:, None]) & (g <= chosen[:, None]))
    return rows[np.argsort(emitted[rows, ks] - emitted[rows, ks - 1], kind="stable")]


def _goodput(emitted: np.ndarray, gammas: tuple[int, ...], round_s: Callable[[tuple[int, ...]], float]) -> float:
    tokens = float(emitted[np.arange(len(gammas)), list(gammas)].sum())
    seconds = round_s(gammas)
    return tokens / seconds if seconds > 0 else float("inf")


def _plans_for_steps(emitted: np.ndarray, lo: np.ndarray, hi: np.ndarray, all_steps: np.ndarray,
                     cost: RoundCostModel, catch_up: np.ndarray) -> np.ndarray:
    """Dinkelbach's iteration for rounds of each number of draft steps at once (every row
    drafts at most that many): per-row choices at each round's price λ. A round whose
    choice repeats is at its fixed point and stays there while the others go on.
    emitted: # [rows, gamma_max + 1]; all_steps: # [S]; returns each round's γ per row # [S, rows]"""
    rows, width = emitted.shape
    g = np.arange(width)
    cap = np.minimum(hi[None, :], all_steps[:, None])  # [S, rows]
    allowed = (g >= lo[:, None])[None] & (g[None, None, :] <= cap[:, :, None])  # [S, rows, gamma_max + 1]
    v_fixed, v_row, v_drafted, _, v_speculating, _ = cost.verify  # the prompts' terms: sunk (`plan_gammas`)
    d_fixed, d_step, d_row_step, d_catch_up = cost.draft
    fixed = cost.overhead_s + v_fixed + v_row * rows + v_speculating + d_fixed + d_step * all_steps  # [S]
    drafting = d_row_step * all_steps[:, None] + d_catch_up * catch_up[None, :]  # [S, rows]: a row's share
    row_cost = v_drafted * g + drafting[:, :, None] * (g > 0)  # [S, rows, gamma_max + 1]
    choice = np.broadcast_to(lo, cap.shape).copy()  # [S, rows]
    each_round, each_row = np.arange(len(all_steps))[:, None], np.arange(rows)[None, :]
    for _ in range(16):
        taken = emitted[each_row, choice]  # [S, rows]
        paid = row_cost[each_round, each_row, choice]  # [S, rows]
        price = taken.sum(axis=1) / (fixed + paid.sum(axis=1))  # [S]
        score = np.where(allowed, emitted[None] - price[:, None, None] * row_cost, -np.inf)
        new = score.argmax(axis=2)  # the first maximum: ties go to the smaller γ
        if (new == choice).all():
            break
        choice = new
    return choice


def crossover_rows(curve: np.ndarray, cost: RoundCostModel, gamma_max: int, max_rows: int = 256,
                   max_round_ratio: float = 0.0, margin: float = 0.0,
                   tpot_target_s: float | None = None, catch_up: float = 0.0) -> int | None:
    """The smallest batch of rows like `curve` (P(first k accepted)) at which speculating
    no longer gains `margin` (every row plans γ = 0); None when it pays up to max_rows."""
    lo_rows, hi_rows = 1, max_rows
    if speculation_pays(curve, cost, gamma_max, hi_rows, margin, max_round_ratio, tpot_target_s, catch_up):
        return None
    while lo_rows < hi_rows:  # goodput gain shrinks as rows grow: bisect
        mid = (lo_rows + hi_rows) // 2
        if speculation_pays(curve, cost, gamma_max, mid, margin, max_round_ratio, tpot_target_s, catch_up):
            lo_rows = mid + 1
        else:
            hi_rows = mid
    return lo_rows


def speculation_pays(curve: np.ndarray, cost: RoundCostModel, gamma_max: int, rows: int, margin: float = 0.0,
                     max_round_ratio: float = 0.0, tpot_target_s: float | None = None, catch_up: float = 0.0) -> bool:
    """Whether a batch of `rows` rows like `curve` (P(first k accepted)), each with TPOT target
    `tpot_target_s` (None: none) and `catch_up` history tokens to read where it drafts, plans
    any γ > 0, gaining at least `margin` over plain decoding where both meet the target
    (within the round-time bound)."""
    curves = np.broadcast_to(curve[:gamma_max], (rows, min(gamma_max, len(curve))))
    targets = None if tpot_target_s is None else [tpot_target_s] * rows
    return any(plan_gammas(curves, [0] * rows, [gamma_max] * rows, cost, margin, max_round_ratio,
                           catch_up=[catch_up] * rows, tpot_targets_s=targets).gammas)
