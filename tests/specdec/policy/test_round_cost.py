"""The round cost model recovers what a round costs from its timings, and merges by addition."""

import random
from dataclasses import replace

import pytest

from specdec.policy.round_cost import (DRAFTED_TIE, RoundCostModel, RoundShape, add_point, add_round_timing,
                                     fit_nonnegative)
from specdec.policy.load_stats import StatsWindow
from timed_rounds import TRUE, timed_rounds, verify_s


def test_known_coefficients_are_recovered_from_exact_timings():
    fitted = RoundCostModel.from_sums(timed_rounds().sums)
    assert fitted.verify == pytest.approx(TRUE.verify, rel=1e-4, abs=1e-7)
    assert fitted.draft == pytest.approx(TRUE.draft, rel=1e-2)  # the per-row-step term's penalty biases a little
    assert fitted.overhead_s == pytest.approx(TRUE.overhead_s)


def test_noisy_timings_give_close_predictions():
    fitted = RoundCostModel.from_sums(timed_rounds(n=2000, noise=0.2).sums)
    for gammas in ([0], [4], [2] * 8, [0, 3, 5, 1] * 4):
        assert fitted.round_s(gammas) == pytest.approx(TRUE.round_s(gammas), rel=0.05)


def test_coefficients_are_never_negative():
    """Parts that cost nothing (here: the draft call's fixed cost and its rows) are fitted as 0
    under noise, never below."""
    free_parts = RoundCostModel(verify=(0.010, 0.001), draft=(0.0, 0.003, 0.0), overhead_s=0.0)
    fitted = RoundCostModel.from_sums(timed_rounds(n=2000, noise=0.3, model=free_parts).sums)
    assert min(*fitted.verify, *fitted.draft) >= 0.0
    assert fitted.verify[1:3] == pytest.approx((0.001, 0.001), rel=0.15)


def test_sums_from_two_replicas_merge_into_the_same_model():
    a, b = timed_rounds(seed=1), timed_rounds(seed=2)
    merged = StatsWindow()
    merged.merge(a)
    merged.merge(dict(b.sums))
    fitted = RoundCostModel.from_sums(merged.sums)
    assert fitted.verify == pytest.approx(TRUE.verify, rel=1e-4, abs=1e-7)


def test_draft_calls_at_one_gamma_still_predict_those_calls():
    """A call's fixed cost and its steps' cost move together at one γ: the split is
    arbitrary, the prediction at that γ is not."""
    window = StatsWindow()
    for rows in (1, 2, 4, 8) * 4:
        shape = RoundShape(rows, 5 * rows, rows, 4)
        add_round_timing(window.add, shape, verify_s(TRUE, shape), TRUE.draft_s(rows, 4), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    for rows in (1, 3, 8):
        assert fitted.draft_s(rows, 4) == pytest.approx(TRUE.draft_s(rows, 4), rel=1e-3)


def test_no_model_from_a_handful_of_rounds_or_before_the_proposer_was_timed():
    window = StatsWindow()
    for _ in range(20):
        add_round_timing(window.add, RoundShape(4, 4, 0, 0), 0.02, 0.0, 0.021)
    assert RoundCostModel.from_sums(window.sums) is None  # no draft call yet
    assert RoundCostModel.from_sums({}) is None
    few = timed_rounds(n=10)
    assert RoundCostModel.from_sums(few.sums) is None  # 10 rounds are noise
    assert RoundCostModel.from_sums(timed_rounds(n=30).sums) is not None


def test_a_round_without_drafts_pays_no_draft_cost():
    assert TRUE.round_s([0, 0]) == pytest.approx(TRUE.overhead_s + TRUE.verify_s(2))
    assert TRUE.round_s([0, 3]) == pytest.approx(TRUE.overhead_s + TRUE.verify_s(2, 3) + TRUE.draft_s(1, 3))
    speculating = RoundCostModel(verify=(0.010, 0.001, 0.0004, 0.0002, 0.006), draft=(0.001, 0.002, 0.0))
    assert speculating.verify_s(2) == pytest.approx(0.012)  # no draft verified: no extra
    assert speculating.verify_s(2, 3) == pytest.approx(0.012 + 3 * 0.0004 + 0.006)


def test_verifying_drafts_at_all_costs_a_fixed_extra_fitted_apart_from_the_drafts():
    """Mostly plain rounds and a few exploring ones (one row, γ cycling 1-4), as while
    speculation is off. Without the term, the extra of a round that verifies drafts is
    spread over its few drafts: a drafted token looks several times dearer than it is."""
    true = RoundCostModel(verify=(0.020, 0.0025, 0.0006, 0.0025, 0.008), draft=(0.006, 0.004, 0.0015))
    window = StatsWindow()
    for k in range(300):
        gamma = 1 + (k // 20) % 4 if k % 20 == 0 else 0
        rows = 1 if gamma else 1 + k % 4
        shape = RoundShape(rows, rows + gamma, 1 if gamma else 0, gamma)
        add_round_timing(window.add, shape, verify_s(true, shape), true.draft_s(shape.draft_rows, gamma), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.verify[:2] == pytest.approx(true.verify[:2], rel=1e-2)
    assert fitted.verify[2] < 1.5 * true.verify[2]  # the tie pulls it a little towards a row's price
    for gammas in ([0], [0, 0, 0], [1], [4]):
        assert fitted.round_s(gammas) == pytest.approx(true.round_s(gammas), rel=0.02)
    without = fit_nonnegative(window.sums, "target", 5, tie=(1, 2, DRAFTED_TIE), features=(0, 1, 2))
    assert without[2] > 3 * true.verify[2]


def test_where_every_round_verified_drafts_the_extra_is_part_of_the_fixed_cost():
    """Mode ON traffic: nothing tells the extra from the call's fixed cost; it is taken as
    fixed (a plain round is predicted as dear as a drafting one's call) and the rounds
    measured are predicted exactly."""
    true = RoundCostModel(verify=(0.020, 0.0025, 0.0006, 0.0025, 0.008), draft=(0.006, 0.004, 0.0015))
    window = StatsWindow()
    for k in range(100):
        rows, gamma = 1 + k % 4, 2 + k % 3
        shape = RoundShape(rows, rows * (gamma + 1), rows, gamma)
        add_round_timing(window.add, shape, verify_s(true, shape), true.draft_s(rows, gamma), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.verify[4] < 1e-4 and fitted.verify[0] == pytest.approx(0.028, rel=1e-3)
    assert fitted.round_s([3, 3]) == pytest.approx(true.round_s([3, 3]), rel=1e-3)


def test_a_thin_windows_model_prices_plain_rounds_itself_and_drafting_as_last_measured():
    """Speculation off: the window's plain rounds re-measure a plain round; drafting keeps
    the prices and the trust region of the model fitted while rows drafted (whose
    speculating extra was part of its fixed cost: every round drafted)."""
    drafting = RoundCostModel(verify=(0.028, 0.0025, 0.0006, 0.0025, 0.0), draft=(0.006, 0.002, 0.001),
                              verify_tokens_high=16.0, draft_tokens_high=12.0, drafting_scale=0.9)
    plain = RoundCostModel(verify=(0.020, 0.003, 0.003, 0.002, 0.0), draft=(0.020, 0.0, 0.002, 0.0),
                           verify_tokens_high=6.0, draft_tokens_high=3.0, drafting_scale=1.2, plain_scale=1.1)
    joined = plain.with_drafting_of(drafting)
    assert joined.verify_s(3) == plain.verify_s(3) and joined.plain_scale == plain.plain_scale
    assert joined.verify_s(2, 8) == pytest.approx(drafting.verify_s(2, 8) + 2 * (0.003 - 0.0025))
    assert joined.draft_s(2, 4, 30) == drafting.draft_s(2, 4, 30) and joined.drafting_scale == 0.9
    assert joined.drafted_limit(2) == 12.0 and plain.drafted_limit(2) == 3.0
    wider = drafting.with_drafting_of(plain)  # the regions join whichever way round
    assert (wider.verify_tokens_high, wider.draft_tokens_high) == (16.0, 12.0)


def test_the_rows_plain_decoding_keeps_in_flight_follow_littles_law():
    """Each row emits one token per plain round: at a demand of D tokens/s, N rows are in
    flight where N / round_s(N) = D; past the batch's most tokens/s (1 / a row's price) no N."""
    calibrated = replace(TRUE, plain_scale=1.2)
    for model in (TRUE, calibrated):
        for rows in (1.0, 4.0, 30.0):
            demand = rows / model.round_s([0] * int(rows))
            assert model.plain_rows_for(demand) == pytest.approx(rows)
        assert model.plain_rows_for(0.0) == 0.0
        assert model.plain_rows_for(1.0 / (model.plain_scale * model.verify[1])) == float("inf")


def test_negative_coefficients_are_refused():
    with pytest.raises(ValueError, match=">= 0"):
        RoundCostModel(verify=(0.01, -0.001), draft=(0.0, 0.0, 0.0))


def test_the_trust_region_covers_what_was_measured_and_a_little_more():
    window = StatsWindow()
    for k in range(100):  # plain rounds of 32 rows, now and then 2 rows exploring 1-4 drafts
        steps = 1 + (k // 16) % 4 if k % 16 == 0 else 0
        shape = RoundShape(32, 32 + 2 * steps, 2 if steps else 0, steps)
        add_round_timing(window.add, shape, verify_s(TRUE, shape), TRUE.draft_s(shape.draft_rows, steps), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert 36 < fitted.verify_tokens_high < 50 and 4 < fitted.draft_tokens_high < 12
    assert 0 < fitted.drafted_limit(32) < 12  # 32 rows may draft a few tokens, not 32 × 8
    assert fitted.drafted_limit(64) == 0


def test_many_small_plain_rounds_do_not_shrink_the_trust_region_below_the_drafting_rounds_measured():
    """Low load: plain rounds of 1-4 rows and, among them, rounds of 4 rows drafting 4 each.
    Those 4 rows may plan as many drafts again; 12 rows may not plan 4 each."""
    window = StatsWindow()
    for k in range(340):
        rows, gamma = (4, 4) if k % 9 == 0 else (1 + k % 4, 0)
        shape = RoundShape(rows, rows * (gamma + 1), rows if gamma else 0, gamma)
        add_round_timing(window.add, shape, verify_s(TRUE, shape), TRUE.draft_s(shape.draft_rows, gamma), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.drafted_limit(4) >= 16 and fitted.drafted_limit(12) < 12 * 4
    few = StatsWindow()  # three rounds at 20 tokens are not yet inside it
    for k in range(40):
        rows, gamma = (4, 4) if k < 3 else (1 + k % 4, 0)
        shape = RoundShape(rows, rows * (gamma + 1), rows if gamma else 0, gamma)
        add_round_timing(few.add, shape, verify_s(TRUE, shape), TRUE.draft_s(shape.draft_rows, gamma), 0.0)
    add_round_timing(few.add, RoundShape(1, 2, 1, 1), 0.01, 0.002, 0.0)  # the fourth call, small
    assert RoundCostModel.from_sums(few.sums).drafted_limit(4) < 16


def test_one_request_at_a_time_does_not_make_drafting_for_more_rows_look_dearer():
    """Calls of one row only: the per-row-step cost cannot be told from the per-step cost;
    it is taken as the step's, so two rows are not predicted to cost twice as much."""
    window = StatsWindow()
    for k in range(40):
        steps = 1 + k % 4
        shape = RoundShape(1, 1 + steps, 1, steps)
        add_round_timing(window.add, shape, verify_s(TRUE, shape), 0.002 + 0.003 * steps, 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.draft_s(1, 4) == pytest.approx(0.014, rel=1e-3)
    assert fitted.draft[2] < 0.01 * fitted.draft[1]


def test_calls_at_one_gamma_give_their_cost_to_the_steps_and_other_gammas_correct_it():
    """γ = 4 only (mode ON traffic): a shorter γ is predicted cheaper in proportion, as an
    autoregressive draft is, so the plan still tries it; rounds at other γs then fit the truth."""
    window = StatsWindow()
    for _ in range(40):
        add_round_timing(window.add, RoundShape(1, 5, 1, 4), TRUE.verify_s(1, 4), TRUE.draft_s(1, 4), 0.0)
    one_gamma = RoundCostModel.from_sums(window.sums)
    assert one_gamma.draft_s(1, 4) == pytest.approx(TRUE.draft_s(1, 4), rel=1e-3)
    assert one_gamma.draft_s(1, 1) == pytest.approx(TRUE.draft_s(1, 4) / 4, rel=0.05)
    for k in range(40):
        steps = 1 + k % 4
        add_round_timing(window.add, RoundShape(1, 1 + steps, 1, steps), TRUE.verify_s(1, steps),
                         TRUE.draft_s(1, steps), 0.0)
    varied = RoundCostModel.from_sums(window.sums)
    assert varied.draft_s(1, 1) == pytest.approx(TRUE.draft_s(1, 1), rel=0.02)


def test_the_history_a_draft_reads_first_is_its_own_cost_not_the_calls():
    """Rows that drafted every round read a few tokens; rows starting again read their whole
    history. Fitted apart, the call's fixed cost stays what it is and a long catch-up is priced."""
    true = RoundCostModel(verify=(0.010, 0.0016), draft=(0.0015, 0.003, 0.0004, 0.00005))
    window = StatsWindow()
    for k in range(60):
        steps, rows = 1 + k % 4, 1 + k % 3
        read = rows * (2 if k % 5 else 70)  # now and then a row comes back after plain rounds
        shape = RoundShape(rows, rows * (steps + 1), rows, steps, read)
        add_round_timing(window.add, shape, verify_s(true, shape), true.draft_s(rows, steps, read), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.draft == pytest.approx(true.draft, rel=1e-3, abs=1e-7)
    assert fitted.round_s([2, 2], catch_up=[2, 70]) == pytest.approx(true.round_s([2, 2], catch_up=[2, 70]), rel=1e-3)
    # only drafting rows read
    assert fitted.round_s([2, 0], catch_up=[2, 70]) < fitted.round_s([2, 2], catch_up=[2, 70])


def test_a_row_and_a_drafted_token_are_priced_apart():
    """A row brings its own attention and sampling; a drafted token only lengthens its row.
    Priced alike and fitted on plain rounds with some drafting ones, a drafted token would
    cost nearly what a row costs and a γ = 4 round would be predicted dearer than it is."""
    true = RoundCostModel(verify=(0.012, 0.0015, 0.0004, 0.0015), draft=(0.004, 0.003, 0.0005))  # no prompts read
    rng = random.Random(4)
    window, one_price_window = StatsWindow(), StatsWindow()
    for k in range(300):
        rows, gamma = rng.randint(1, 4), (4 if k % 20 == 0 else 0)  # mostly plain, as with speculation off
        shape = RoundShape(rows, rows * (gamma + 1), rows if gamma else 0, gamma)
        add_round_timing(window.add, shape, verify_s(true, shape), true.draft_s(shape.draft_rows, gamma), 0.0)
        add_point(one_price_window.add, "one", (1.0, float(shape.tokens)), verify_s(true, shape))
    fitted = RoundCostModel.from_sums(window.sums)
    # the tie pulls a little where drafts are rare
    assert fitted.verify == pytest.approx(true.verify, rel=1e-2, abs=1e-7)
    assert fitted.round_s([4]) == pytest.approx(true.round_s([4]), rel=1e-3)
    fixed, token = fit_nonnegative(one_price_window.sums, "one", 2)
    one_price = RoundCostModel(verify=(fixed, token), draft=true.draft)
    assert one_price.verify_s(1, 4) > 1.1 * true.verify_s(1, 4)  # its drafts priced near a row


def test_where_drafts_never_vary_apart_from_rows_a_drafted_token_costs_what_a_row_does():
    window = StatsWindow()
    for rows in (1, 2, 3, 4) * 10:  # plain rounds only: nothing tells what a drafted token costs
        add_round_timing(window.add, RoundShape(rows, rows, 0, 0), TRUE.verify_s(rows), 0.0, 0.0)
    for _ in range(4):
        add_round_timing(window.add, RoundShape(1, 1, 1, 2), TRUE.verify_s(1), TRUE.draft_s(1, 2), 0.0)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.verify[2] == pytest.approx(fitted.verify[1], rel=1e-6)
    assert fitted.verify_s(3) == pytest.approx(TRUE.verify_s(3), rel=1e-3)


def test_a_three_term_draft_model_has_no_catch_up_cost():
    assert RoundCostModel(verify=(0.01, 0.001), draft=(0.001, 0.002, 0.0)).draft == (0.001, 0.002, 0.0, 0.0)
    with pytest.raises(ValueError, match="draft"):
        RoundCostModel(verify=(0.01, 0.001), draft=(0.001, 0.002))
    expanded = RoundCostModel(verify=(0.01, 0.001, 0.0002), draft=(0.0, 0.0, 0.0)).verify
    assert expanded == (0.01, 0.001, 0.001, 0.0002, 0.0, 0.0)


def test_the_model_keeps_a_newcomers_mean_prompt_from_the_rounds_that_read_prompts():
    window = timed_rounds(n=50)
    assert RoundCostModel.from_sums(window.sums).prompt_tokens == 0.0  # no prompt read yet
    for prompts, tokens in ((1, 60), (2, 140), (0, 0)):
        shape = RoundShape(4, 4 + tokens, 0, 0, prompts=prompts, prompt_tokens=tokens)
        add_round_timing(window.add, shape, verify_s(TRUE, shape), 0.0, verify_s(TRUE, shape))
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.prompt_tokens == pytest.approx(200 / 3)
    assert fitted.prefill_round_s([0] * 4) == pytest.approx(fitted.round_s([0] * 4, prompt_tokens=200 / 3))
    assert fitted.verify == pytest.approx(TRUE.verify, rel=1e-4, abs=1e-7)  # prefill rounds are fitted like any other


def test_a_prompt_token_is_priced_apart_from_a_verified_token():
    """A newcomer's prompt is read in one batched forward; a verified token is sampled and
    judged on its own. Priced alike, prefill rounds would pull the fit's fixed cost up and a
    plain round would be predicted far dearer than it is."""
    true = RoundCostModel(verify=(0.005, 0.0009, 0.0009, 0.00015), draft=(0.001, 0.0015, 0.0002))
    rng = random.Random(3)
    window, one_price_window = StatsWindow(), StatsWindow()
    for _ in range(300):
        rows, gamma = rng.randint(1, 4), rng.choice((0, 2, 4))
        prompts = 1 if rng.random() < 0.2 else 0
        shape = RoundShape(rows, rows * (gamma + 1) + 64 * prompts, rows if gamma else 0, gamma,
                           prompts=prompts, prompt_tokens=64 * prompts)
        verify, draft = verify_s(true, shape), true.draft_s(shape.draft_rows, gamma)
        add_round_timing(window.add, shape, verify, draft, 0.0)
        add_point(one_price_window.add, "one", (1.0, float(shape.tokens)), verify)  # every token alike
    fitted = RoundCostModel.from_sums(window.sums)
    # every prompt of one length: the prompt-round step cannot be told from the per-token
    # price, and goes (all but a ridge's share) to the per-token price
    assert fitted.verify[:5] == pytest.approx(true.verify[:5], rel=1e-3, abs=1e-7)
    assert fitted.verify[5] < 1e-3 * 64 * true.verify[3]
    assert fitted.round_s([0]) == pytest.approx(true.round_s([0]), rel=1e-3)
    assert fitted.prefill_round_s([0]) == pytest.approx(true.round_s([0], prompt_tokens=64), rel=1e-3)
    one_price = RoundCostModel(verify=fit_nonnegative(one_price_window.sums, "one", 2), draft=true.draft)
    assert one_price.round_s([0]) > 1.2 * true.round_s([0])


PROMPT_STEP_S = 0.050  # the emulated target's prompt forward at time scale 8: one forward, whatever its length
DECODING = RoundCostModel(verify=(0.050, 0.0002, 0.00005, 0.00001), draft=(0.002, 0.005, 0.0001, 0.0))


def stepped_verify_s(shape):
    """The target's call: `DECODING`'s, and a forward more when it reads any prompt."""
    return verify_s(DECODING, shape) + (PROMPT_STEP_S if shape.prompt_tokens > 0 else 0.0)


def full_batch_stream(n=400, seed=5):
    """AUTO's rounds at a full batch: 28-32 rows drafting γ 1-3 each (mostly 2), a few plain
    rounds, most of those reading a long prompt; 40 % of rounds read 1-2 newcomers' prompts
    of 60-250 tokens, timed by `stepped_verify_s`."""
    rng = random.Random(seed)
    window = StatsWindow()
    for _ in range(n):
        rows = rng.randint(28, 32)
        plain = rng.random() < 0.06
        reads = rng.random() < (0.8 if plain else 0.4)
        prompts = rng.randint(1, 2) if reads else 0
        prompt_tokens = sum(rng.randint(60, 250) for _ in range(prompts))
        gammas = [0] * rows if plain else [rng.choice((1, 2, 2, 2, 3)) for _ in range(rows)]
        drafting = [g for g in gammas if g > 0]
        shape = RoundShape(rows, rows + sum(gammas) + prompt_tokens, len(drafting), max(drafting, default=0),
                           prompts=prompts, prompt_tokens=prompt_tokens)
        verify, draft = stepped_verify_s(shape), DECODING.draft_s(shape.draft_rows, shape.steps)
        add_round_timing(window.add, shape, verify, draft, verify + draft)
    return window


def test_a_round_that_reads_a_prompt_pays_a_step_that_no_decoding_round_pays():
    """The emulated target reads newcomers' prompts in a forward of their own: a round that
    reads any prompt pays one forward more, almost whatever its length. Fitted by a per-token
    price alone (the old code), the step leaked into the decoding prices by each kind's share
    of prompt rounds: at a full batch where plain rounds were mostly prompt rounds, plain
    decoding's prompt-free round was priced dear against drafting's, and the plan's choice
    between γ 0 and γ > 0 was priced off the measured ratio. With the prompt-round term both
    kinds of decoding round are priced as they cost, and so is their ratio."""
    fitted = RoundCostModel.from_sums(full_batch_stream().sums)
    plain, drafting = [0] * 32, [2] * 32
    for gammas in (plain, drafting):
        assert fitted.round_s(gammas) == pytest.approx(DECODING.round_s(gammas), rel=0.02)
        with_prompt = DECODING.round_s(gammas, prompt_tokens=150) + PROMPT_STEP_S
        assert fitted.round_s(gammas, prompt_tokens=150) == pytest.approx(with_prompt, rel=0.02)
    ratio = fitted.round_s(drafting) / fitted.round_s(plain)
    assert ratio == pytest.approx(DECODING.round_s(drafting) / DECODING.round_s(plain), rel=0.02)
    assert fitted.verify[5] == pytest.approx(PROMPT_STEP_S, rel=0.02)
