"""The goodput plan: each row's γ maximises the batch's emitted tokens per second (its TPOT
targets and the waits between rounds: test_gamma_tpot_targets.py)."""

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest

from specdec.policy.gamma import crossover_rows, plan_gammas
from specdec.policy.prefix_acceptance import expected_tokens
from specdec.policy.round_cost import RoundCostModel
from gamma_plans import COMPUTE_BOUND, CPU_TINY_PAIR, geometric, plan

FREE_DRAFTS = RoundCostModel(verify=(0.010, 0.0), draft=(0.0, 0.0, 0.0))


def brute_force(alphas, cost, gamma_max):
    """The best goodput over every combination (ties: fewer tokens drafted)."""
    best, best_value = None, -1.0
    for gammas in itertools.product(range(gamma_max + 1), repeat=len(alphas)):
        tokens = sum(expected_tokens(a, g) for a, g in zip(alphas, gammas))
        value = tokens / cost.round_s(gammas)
        if value > best_value * (1 + 1e-12):
            best, best_value = gammas, value
    return best, best_value


def test_nothing_accepted_means_plain_decoding():
    assert plan([0.0], CPU_TINY_PAIR).gammas == (0,)
    assert plan([0.0] * 4, FREE_DRAFTS).gammas == (0,) * 4


def test_everything_accepted_with_affordable_drafts_means_gamma_max():
    assert plan([1.0], CPU_TINY_PAIR).gammas == (8,)
    assert plan([1.0], CPU_TINY_PAIR, gamma_max=3).gammas == (3,)


def test_a_compute_bound_batch_does_not_speculate_even_at_high_acceptance():
    assert plan([0.9] * 8, COMPUTE_BOUND).gammas == (0,) * 8


def test_a_single_request_gets_the_best_gamma():
    for alpha in (0.3, 0.5, 0.7, 0.85, 0.95):
        chosen = plan([alpha], CPU_TINY_PAIR)
        best, value = brute_force([alpha], CPU_TINY_PAIR, 8)
        assert chosen.gammas == best and chosen.goodput == pytest.approx(value)


def test_the_plan_is_the_best_over_every_combination_of_small_batches():
    rng = random.Random(0)
    costs = [CPU_TINY_PAIR, COMPUTE_BOUND, RoundCostModel((0.002, 0.0007), (0.003, 0.001, 0.0001), 0.001),
             RoundCostModel((0.004, 0.0007, 0.0005, 0.0007, 0.006), (0.002, 0.001, 0.0001))]  # verifying drafts: +6 ms
    for _ in range(100):
        alphas = [rng.choice([0.0, 0.2, 0.5, 0.7, 0.9, 1.0]) for _ in range(rng.randint(1, 3))]
        cost = rng.choice(costs)
        chosen = plan(alphas, cost, gamma_max=5)
        _, value = brute_force(alphas, cost, 5)
        assert chosen.goodput == pytest.approx(value, rel=1e-9), (alphas, cost, chosen)


def test_rows_of_one_batch_get_their_own_gamma():
    """A row whose drafts are usually accepted speculates; its poor neighbour does not."""
    gammas = plan([0.95, 0.05], CPU_TINY_PAIR).gammas
    assert gammas[0] >= 3 and gammas[1] == 0


def test_growing_batches_speculate_less_and_then_not_at_all():
    previous = 9
    for rows in (1, 2, 4, 8, 16, 32, 64):
        gammas = plan([0.7] * rows, CPU_TINY_PAIR).gammas
        assert max(gammas) <= previous
        previous = max(gammas)
    heavy = RoundCostModel(verify=(0.010, 0.0049), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
    assert max(plan([0.7] * 64, heavy).gammas) == 0


def test_fixed_rows_keep_their_gamma_and_weigh_in_the_cost():
    chosen = plan([0.9, 0.9], CPU_TINY_PAIR, lo=[6, 0], hi=[6, 8])
    assert chosen.gammas[0] == 6
    assert plan([0.2, 0.0], CPU_TINY_PAIR, lo=[0, 4], hi=[0, 4]).gammas == (0, 4)


def test_a_margin_keeps_marginal_speculation_off():
    alpha = 0.55  # speculation barely pays here
    assert plan([alpha], CPU_TINY_PAIR).gammas != (0,)
    gain = plan([alpha], CPU_TINY_PAIR).goodput / plan([alpha], CPU_TINY_PAIR).plain_goodput - 1
    assert 0 < gain < 0.2
    assert plan([alpha], CPU_TINY_PAIR, margin=gain + 0.01).gammas == (0,)


def test_a_negative_margin_lets_a_plan_fall_short_of_plain_decoding_by_that_much():
    """One row, a verify of 11 ms plain, a drafted token 1 ms more and the draft call 4 ms: at
    α 0.41 γ = 1 emits 1.41 tokens in 16 ms, 97 % of plain decoding's goodput."""
    cost = RoundCostModel(verify=(0.010, 0.001), draft=(0.001, 0.003, 0.0))
    best = plan([0.41], cost, margin=-0.05)
    assert best.gammas == (1,) and best.goodput / best.plain_goodput == pytest.approx(1.41 / 0.016 * 0.011)
    assert plan([0.41], cost, margin=-0.02).gammas == (0,)  # 3 % short: more than it may be
    assert plan([0.41], cost).gammas == (0,)


def test_crossover_rows_is_where_speculation_stops_paying():
    curve = geometric(0.7)
    rows = crossover_rows(curve, CPU_TINY_PAIR, 8)
    heavy = RoundCostModel(verify=(0.010, 0.0049), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
    at = crossover_rows(curve, heavy, 8)
    assert at is not None and max(plan([0.7] * at, heavy).gammas) == 0
    assert at == 1 or max(plan([0.7] * (at - 1), heavy).gammas) > 0
    assert rows is None or rows > at  # cheaper verification: speculation pays to larger batches
    assert crossover_rows(geometric(0.0), CPU_TINY_PAIR, 8) == 1


def test_plans_stay_inside_the_cost_models_trust_region():
    """A model fitted on plain rounds of 32 rows does not know what 32 rows drafting 8 each
    cost: the plan drafts at most what the measurements cover, least likely drafts first cut."""
    from dataclasses import replace

    narrow = replace(FREE_DRAFTS, verify_tokens_high=40.0)
    alphas = [0.9] * 16 + [0.5] * 16
    chosen = plan(alphas, narrow)
    assert sum(chosen.gammas) <= 40 - 32
    assert sum(chosen.gammas[:16]) >= sum(chosen.gammas[16:])
    assert narrow.drafted_limit(32) == 8 and narrow.drafted_limit(50) == 0
    assert plan(alphas, FREE_DRAFTS).gammas == (8,) * 32  # unbounded: everything


# what the emulated H100 pair costs at time scale 8, as fitted after a stretch of plain rounds of
# 32 rows: the trust region covers their forwards and a quarter more (about 15 drafted tokens)
AFTER_PLAIN_32 = RoundCostModel(verify=(0.060, 0.0003, 0.0001, 0.0001, 0.002), draft=(0.004, 0.011, 0.00005, 0.0),
                                overhead_s=0.002, verify_tokens_high=47.6)


def test_the_margin_is_judged_on_the_plan_untrimmed_by_the_trust_region_and_the_plan_steps_inside_it():
    """Trimmed to the few drafts plain rounds cover, no plan clears the margin, nothing would
    draft and the region would never grow. Judged untrimmed (γ 3 for all: +45 %), the plan
    drafts what the region allows, the likeliest drafts first; where the untrimmed plan
    does not clear the margin either, it decodes plainly."""
    rows = 32
    curves = np.stack([geometric(0.7)] * rows)
    unbounded = plan_gammas(curves, [0] * rows, [8] * rows, replace(AFTER_PLAIN_32, verify_tokens_high=float("inf")))
    assert unbounded.gammas == (3,) * rows and unbounded.goodput > 1.4 * unbounded.plain_goodput
    stepped = plan_gammas(curves, [0] * rows, [8] * rows, AFTER_PLAIN_32, margin=0.05)
    assert 0 < sum(stepped.gammas) <= AFTER_PLAIN_32.drafted_limit(rows) < rows
    assert stepped.goodput < 1.05 * stepped.plain_goodput, "trimmed, it would not clear the margin"
    assert stepped.reach_goodput == pytest.approx(unbounded.goodput)
    assert plan_gammas(curves, [0] * rows, [8] * rows, AFTER_PLAIN_32, margin=0.5).gammas == (0,) * rows
    whole = plan_gammas(curves[:4], [0] * 4, [8] * 4, AFTER_PLAIN_32, margin=0.05)  # inside the region: as priced
    assert whole.reach_goodput == 0.0 and any(whole.gammas)


def test_the_round_time_bound_shortens_gamma_so_a_rejected_draft_costs_at_most_that_many_plain_rounds():
    """Goodput alone drafts a long γ for a row that accepts nearly everything; the bound keeps
    the round (what a row whose first draft is rejected waits for one token) within 2 plain ones."""
    slow_steps = RoundCostModel(verify=(0.010, 0.0005), draft=(0.001, 0.004, 0.0))
    free = plan([0.95], slow_steps)
    bounded = plan_gammas(geometric(0.95)[None, :], [0], [8], slow_steps, max_round_ratio=2.0)
    plain_s = slow_steps.round_s((0,))
    assert slow_steps.round_s(free.gammas) > 2 * plain_s
    assert 0 < bounded.gammas[0] < free.gammas[0]
    assert slow_steps.round_s(bounded.gammas) <= 2 * plain_s < slow_steps.round_s((bounded.gammas[0] + 1,))


def test_a_bounded_batch_drafts_less_but_still_drafts():
    cheap_tokens = RoundCostModel(verify=(0.010, 0.0002), draft=(0.001, 0.002, 0.0001))
    alphas = [0.95] * 4 + [0.6] * 4
    curves = np.stack([geometric(a) for a in alphas])
    free = plan_gammas(curves, [0] * 8, [8] * 8, cheap_tokens)
    bounded = plan_gammas(curves, [0] * 8, [8] * 8, cheap_tokens, max_round_ratio=1.5)
    plain_s = cheap_tokens.round_s((0,) * 8)
    assert cheap_tokens.round_s(free.gammas) > 1.5 * plain_s >= cheap_tokens.round_s(bounded.gammas)
    assert any(bounded.gammas) and sum(bounded.gammas[:4]) >= sum(bounded.gammas[4:])
    assert all(b <= f for b, f in zip(bounded.gammas, free.gammas))


def test_a_bound_that_no_draft_fits_means_plain_decoding_and_no_crossover_beyond_it():
    costly_call = RoundCostModel(verify=(0.010, 0.0), draft=(0.012, 0.001, 0.0))  # the call alone > a plain round
    assert plan([0.9], costly_call).gammas != (0,)
    assert plan_gammas(geometric(0.9)[None, :], [0], [8], costly_call, max_round_ratio=2.0).gammas == (0,)
    assert crossover_rows(geometric(0.9), costly_call, 8, max_round_ratio=2.0) == 1


def test_rows_that_fix_their_gamma_keep_it_under_the_bound():
    curves = np.stack([geometric(0.9)] * 2)
    chosen = plan_gammas(curves, [8, 0], [8, 8], CPU_TINY_PAIR, max_round_ratio=1.01)
    assert chosen.gammas[0] == 8


def test_the_bound_is_set_against_plain_decodings_own_long_round_the_one_that_reads_a_newcomers_prompt():
    """At 1.0 a steady round may take what a plain round with a mean prompt takes (plain
    decoding's tail), a round that reads a prompt as long as that drafts nothing, and a
    prompt shorter than the mean leaves the rest of that time to drafts."""
    per_token = RoundCostModel(verify=(0.010, 0.0005), draft=(0.002, 0.002, 0.0), prompt_tokens=20)
    curve = geometric(0.8)[None, :]
    assert per_token.round_s((0,), prompt_tokens=30) == pytest.approx(per_token.round_s((0,)) + 30 * 0.0005)
    assert per_token.prefill_round_s((0,)) == pytest.approx(per_token.round_s((0,), prompt_tokens=20))
    assert per_token.prefill_round_s((0,), prompt_tokens=50) == pytest.approx(per_token.round_s((0,), prompt_tokens=50))
    free = plan_gammas(curve, [0], [8], per_token)
    steady = plan_gammas(curve, [0], [8], per_token, max_round_ratio=1.0)
    assert 0 < steady.gammas[0] < free.gammas[0]
    assert per_token.round_s(steady.gammas) <= per_token.prefill_round_s((0,))
    assert per_token.prefill_round_s((0,)) < per_token.round_s((steady.gammas[0] + 1,))
    assert plan_gammas(curve, [0], [8], per_token, max_round_ratio=1.0, prompt_tokens=20).gammas == (0,)
    short = plan_gammas(curve, [0], [8], per_token, max_round_ratio=1.0, prompt_tokens=10)  # 5 ms left for drafts
    assert 0 < short.gammas[0] < steady.gammas[0]
    assert plan_gammas(curve, [0], [8], per_token, prompt_tokens=20).gammas[0] > 0  # unbounded goodput drafts on
    no_prompt_seen = RoundCostModel(verify=(0.010, 0.0005), draft=(0.002, 0.002, 0.0))
    assert plan_gammas(curve, [0], [8], no_prompt_seen, max_round_ratio=1.0).gammas == (0,)


def test_a_row_that_must_catch_up_on_a_long_history_waits_while_the_others_draft():
    reading = RoundCostModel(verify=(0.010, 0.0003), draft=(0.001, 0.002, 0.0003, 0.0002))
    curves = np.stack([geometric(0.8)] * 3)
    steady = plan_gammas(curves, [0] * 3, [8] * 3, reading, catch_up=[3, 3, 3])
    one_behind = plan_gammas(curves, [0] * 3, [8] * 3, reading, catch_up=[3, 3, 120])
    assert all(steady.gammas)
    assert one_behind.gammas[2] == 0 and all(one_behind.gammas[:2])
    assert all(plan_gammas(curves, [0] * 3, [8] * 3, reading).gammas)  # no catch-up given: none priced


def test_a_newcomers_prompt_read_in_the_round_does_not_make_drafting_look_cheaper():
    """The prompt is read whatever the plan: its time is sunk. Counted in the round's own
    ratio it lowers plain decoding's goodput more than drafting's, and a round that reads a
    long prompt would draft where the same rows without it do not."""
    prompts_dear = RoundCostModel(verify=(0.010, 0.0005, 0.0025, 0.001), draft=(0.002, 0.001, 0.0005))
    curves = np.stack([geometric(0.6)] * 8)
    without = plan_gammas(curves, [0] * 8, [8] * 8, prompts_dear)
    with_prompt = plan_gammas(curves, [0] * 8, [8] * 8, prompts_dear, prompt_tokens=200)
    assert without.gammas == (0,) * 8
    assert with_prompt.gammas == without.gammas and with_prompt.goodput == pytest.approx(without.goodput)
    counted = prompts_dear.round_s((1,) * 8, 200), prompts_dear.round_s((0,) * 8, 200)
    emitted = 8 * (1 + 0.6), 8.0
    assert emitted[0] / counted[0] > emitted[1] / counted[1]  # the round's own ratio would have drafted
