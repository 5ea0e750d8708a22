"""The goodput plan under each row's time-per-output-token (TPOT) target, and with what rows wait
per round besides the decoding round (the plan itself: test_gamma.py)."""

import random
from dataclasses import replace

import numpy as np
import pytest

from specdec.policy.gamma import plan_gammas
from specdec.policy.prefix_acceptance import expected_tokens
from specdec.policy.round_cost import RoundCostModel
from gamma_plans import COMPUTE_BOUND, CPU_TINY_PAIR, geometric, plan

# ---- the objective's constraint: each row's time-per-output-token (TPOT) target ----------

CHEAP_DRAFTS = RoundCostModel(verify=(0.010, 0.0005), draft=(0.0005, 0.001, 0.0001), overhead_s=0.0005)


def predicted_tpot(alphas, gammas, cost):
    """Each row's predicted seconds per emitted token: the round over the tokens it emits."""
    return [cost.round_s(gammas) / expected_tokens(a, g) for a, g in zip(alphas, gammas)]


def targeted(alphas, targets, cost=CHEAP_DRAFTS, margin=0.0, gamma_max=8):
    curves = np.stack([geometric(a, gamma_max) for a in alphas])
    rows = len(alphas)
    return plan_gammas(curves, [0] * rows, [gamma_max] * rows, cost, margin, tpot_targets_s=targets)


@pytest.mark.parametrize("cost", [CPU_TINY_PAIR, CHEAP_DRAFTS, COMPUTE_BOUND])
def test_targets_every_plan_meets_change_nothing(cost):
    rng = random.Random(7)
    for _ in range(30):
        alphas = [rng.random() for _ in range(rng.randint(1, 6))]
        free = plan(alphas, cost)
        assert targeted(alphas, [float("inf")] * len(alphas), cost).gammas == free.gammas
        assert targeted(alphas, [60.0] * len(alphas), cost).gammas == free.gammas


def test_a_row_that_decodes_plainly_keeps_its_target_by_making_its_neighbours_draft_less():
    alphas = [0.95, 0.3]  # the plan drafts for the first row only: the second pays the longer round
    free = plan(alphas, CHEAP_DRAFTS)
    assert free.gammas[0] > 0 and free.gammas[1] == 0
    slowest = predicted_tpot(alphas, free.gammas, CHEAP_DRAFTS)[1]
    chosen, previous = [], free.goodput
    for target in np.linspace(slowest * 1.2, slowest * 0.5, 15):  # tighter and tighter
        p = targeted(alphas, [float("inf"), target])
        if p.tpot_excess <= 1.0:
            assert predicted_tpot(alphas, p.gammas, CHEAP_DRAFTS)[1] <= target * (1 + 1e-9)
        assert p.goodput <= previous * (1 + 1e-9), "a tighter target never buys more tokens/s"
        previous = p.goodput
        chosen.append(p.gammas)
    assert chosen[0] == free.gammas and len(set(chosen)) >= 3, chosen
    assert all(g[0] < free.gammas[0] for g in chosen[5:]), "under a tight target the good row drafts less"


def test_a_row_that_misses_its_target_in_every_plan_does_not_hold_its_neighbours_back():
    """No plan meets every target: the plan meets as many as it can, then the most tokens/s
    (DistServe's goodput counts requests within their targets; a row that misses in every
    plan misses whatever its neighbours draft)."""
    alphas = [0.95, 0.0]  # the second row emits one token a round whatever is drafted
    p = targeted(alphas, [float("inf"), 0.001], CPU_TINY_PAIR)
    free = plan(alphas, CPU_TINY_PAIR)
    assert free.gammas[0] > 0 and p.gammas == free.gammas
    assert p.tpot_excess == pytest.approx(CPU_TINY_PAIR.round_s(p.gammas) / 0.001)


def test_when_no_plan_meets_every_target_the_plan_meets_the_most_whatever_the_margin():
    """Plain decoding meets neither row's target; drafting for the good row meets its own (the
    poor row's TPOT grows with the longer round, as it would miss anyway): the plan drafts,
    even where its tokens/s gain is inside a 10x margin. The unluckiest row used to decide
    (the plan that missed the worst row's target least), and kept whole batches plain."""
    alphas = [0.95, 0.3]
    plain_tpot = CHEAP_DRAFTS.round_s((0, 0))
    p = targeted(alphas, [0.8 * plain_tpot] * 2, CHEAP_DRAFTS, margin=10.0)
    assert p.gammas[0] > 0 and p.tpot_excess > 1
    tpot = predicted_tpot(alphas, p.gammas, CHEAP_DRAFTS)
    assert tpot[0] <= 0.8 * plain_tpot < tpot[1]


def test_a_target_plain_decoding_misses_turns_speculation_on_whatever_the_margin():
    plain_tpot = CPU_TINY_PAIR.round_s((0,))
    assert plan([0.8], CPU_TINY_PAIR, margin=10.0).gammas == (0,), "a 10x margin keeps speculation off"
    p = targeted([0.8], [0.8 * plain_tpot], CPU_TINY_PAIR, margin=10.0)
    assert p.gammas[0] > 0 and p.tpot_excess <= 1.0
    assert predicted_tpot([0.8], p.gammas, CPU_TINY_PAIR)[0] <= 0.8 * plain_tpot


def test_plain_decoding_that_meets_the_targets_still_needs_the_margin_to_lose():
    plain_tpot = CPU_TINY_PAIR.round_s((0,))
    assert targeted([0.8], [2 * plain_tpot], CPU_TINY_PAIR, margin=10.0).gammas == (0,)


@pytest.mark.parametrize("margin", [0.05, -0.05, 0.3])
def test_an_unreachable_target_leaves_rows_alike_planned_as_without_one(margin):
    """Under overload no plan meets the target; the error band must still hold speculation
    back where its gain is within it (for rows alike TPOT = rows / tokens/s)."""
    rng = random.Random(3)
    for _ in range(20):
        rows, alpha = rng.randint(1, 12), rng.uniform(0.2, 0.95)
        cost = rng.choice([CPU_TINY_PAIR, CHEAP_DRAFTS, COMPUTE_BOUND])
        free = plan([alpha] * rows, cost, margin=margin)
        unreachable = targeted([alpha] * rows, [1e-6] * rows, cost, margin=margin)
        assert unreachable.gammas == free.gammas and unreachable.tpot_excess > 1


# ---- what a row waits per round besides the decoding round (RoundCostModel.wait_scale) ----

def waiting(cost, scale):
    """The same prices, where rows were measured waiting `scale` times the planned decoding round."""
    return replace(cost, wait_scale=scale)


def test_a_plan_that_meets_a_target_only_without_the_waits_between_rounds_is_refused_once_they_are_measured():
    alphas = [0.95, 0.3]
    free = plan(alphas, CHEAP_DRAFTS)
    target = 0.9 * predicted_tpot(alphas, free.gammas, CHEAP_DRAFTS)[1]  # the poor row misses in the free plan
    on_paper = targeted(alphas, [float("inf"), target])
    assert on_paper.tpot_excess <= 1.0 and on_paper.gammas != free.gammas, "trimming met it on paper"
    measured = waiting(CHEAP_DRAFTS, 1.05)
    waited = [measured.row_wait_s(on_paper.gammas) / expected_tokens(a, g) for a, g in zip(alphas, on_paper.gammas)]
    assert waited[1] > target, "with what rows wait besides, that plan misses"
    p = targeted(alphas, [float("inf"), target], measured)
    assert p.gammas != on_paper.gammas and p.tpot_excess <= 1.0
    assert p.gammas[0] < on_paper.gammas[0], "the good row drafts still less, so that the poor row keeps its target"
    assert measured.row_wait_s(p.gammas) / expected_tokens(alphas[1], p.gammas[1]) <= target * (1 + 1e-9)


def test_a_row_the_waits_put_out_of_every_plans_reach_no_longer_trims_its_neighbours_drafts():
    """Judged without the waits, the poor row looked savable and the good row drafted less
    for it; with them, it misses in every plan, so the good row drafts what pays."""
    alphas = [0.95, 0.3]
    free = plan(alphas, CHEAP_DRAFTS)
    target = 1.1 * CHEAP_DRAFTS.round_s((0, 0))  # plain decoding meets it on paper, not with 20 % more wait
    assert targeted(alphas, [float("inf"), target]).gammas != free.gammas
    p = targeted(alphas, [float("inf"), target], waiting(CHEAP_DRAFTS, 1.2))
    assert p.gammas == free.gammas and p.tpot_excess > 1.0


def test_the_waits_do_not_move_a_plan_without_targets():
    alphas = [0.95, 0.6, 0.3]
    assert plan(alphas, waiting(CHEAP_DRAFTS, 2.0)).gammas == plan(alphas, CHEAP_DRAFTS).gammas


def test_one_row_at_its_target_does_not_decide_the_plan_for_the_batch():
    """Costs like the emulated pair's at time scale 8: γ 1 for all keeps every row's predicted
    TPOT within 60 ms, the poor row's just (59.2 ms); γ 2 for all streams 6 % more tokens/s
    and keeps the seven others further within, the poor row just past (62.0 ms). Counted by a
    hard threshold, the poor row decided the batch's γ (γ 1 for all); each row counted by
    its chance of landing within (its TPOT scatters around the prediction), the two plans
    keep as many rows within, and tokens/s decides."""
    cost = RoundCostModel(verify=(0.060, 0.0004), draft=(0.004, 0.011, 0.0003), overhead_s=0.002)
    curves = np.stack([geometric(0.7)] * 7 + [geometric(0.45)])
    plan = plan_gammas(curves, [0] * 8, [8] * 8, cost, tpot_targets_s=[0.060] * 8)
    assert plan.gammas == (2,) * 8
    assert plan.tpot_excess > 1.0  # the poor row is predicted just past its target
    # where the target separates the plans for half the batch, it still decides: four poor rows (α 0.35)
    # within 65 ms at γ 1 (64 ms), past it at γ 2 (70 ms), which streams the most tokens/s
    half = np.stack([geometric(0.8)] * 4 + [geometric(0.35)] * 4)
    assert plan_gammas(half, [0] * 8, [8] * 8, cost).gammas == (2,) * 8
    assert plan_gammas(half, [0] * 8, [8] * 8, cost, tpot_targets_s=[0.065] * 8).gammas == (1,) * 8


def test_a_target_just_above_plain_decodings_tpot_is_kept_by_decoding_plainly():
    """A request's TPOT scatters around its row's prediction by its rounds alone when the row
    decodes plainly, and by its drafts' luck as well when it drafts (docs/goodput.md: 2-9 %
    under OFF, 24-30 % under ON's γ 4). Costs like the emulated pair's at time scale 8 with a
    dear draft call: γ 3 for all is predicted 13 % under plain decoding's TPOT and streams
    more tokens/s. Under a target 1/0.92 of plain decoding's TPOT, plain decoding meets it for
    nearly every row and drafting misses it for the unlucky ones: one scatter for both
    (10 %) judged drafting the safer plan."""
    cost = RoundCostModel(verify=(0.060, 0.0004), draft=(0.030, 0.004, 0.0001), overhead_s=0.002)
    rows = 32
    curves = np.stack([geometric(0.7)] * rows)
    plain_tpot = cost.round_s((0,) * rows)
    free = plan_gammas(curves, [0] * rows, [8] * rows, cost)
    assert free.gammas == (3,) * rows and free.goodput > free.plain_goodput
    assert cost.round_s(free.gammas) / expected_tokens(0.7, 3) < 0.9 * plain_tpot

    def under(target):
        return plan_gammas(curves, [0] * rows, [8] * rows, cost, tpot_targets_s=[target] * rows).gammas

    assert under(plain_tpot / 0.92) == (0,) * rows, "just above plain decoding's TPOT: plain decoding keeps it"
    assert min(under(plain_tpot / 1.05)) > 0, "just below it: plain decoding misses, drafting may meet it"
    assert under(2 * plain_tpot) == free.gammas, "loose: every plan meets it, tokens/s decides"
