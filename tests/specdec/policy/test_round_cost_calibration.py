"""Calibration of the round cost model: planned rounds scale their kind's prediction by what
they took (prompt-free rounds only, bounded, shrunk towards 1 while few are measured), and what
rows wait between emissions scales the decoding round they wait for."""

import pytest

from specdec.policy.round_cost import (CALIBRATION_LIMITS, CALIBRATION_PRIOR_S, WAIT_PRIOR_S, RoundCostModel,
                                     RoundShape, add_round_timing, add_row_waits, is_cost_key)
from timed_rounds import timed_rounds


def test_planned_rounds_calibrate_predictions_by_kind():
    """Rounds that verified drafts took 0.6x what the parts' sum predicted (the look-ahead had
    drafted them), plain ones 1.2x: each kind's prediction is scaled by its own ratio."""
    window = timed_rounds(n=50)
    for _ in range(40):
        add_round_timing(window.add, RoundShape(1, 5, 1, 4), 0.010, 0.010, 0.6 * 0.030, planned_s=0.030)
        add_round_timing(window.add, RoundShape(1, 1, 0, 0), 0.012, 0.0, 1.2 * 0.012, planned_s=0.012)
    fitted = RoundCostModel.from_sums(window.sums)
    prior = CALIBRATION_PRIOR_S
    assert fitted.drafting_scale == pytest.approx((40 * 0.018 + prior) / (40 * 0.030 + prior))
    assert fitted.plain_scale == pytest.approx((40 * 0.0144 + prior) / (40 * 0.012 + prior))
    assert fitted.round_s([4]) == pytest.approx(fitted.drafting_scale * fitted.base_round_s([4]))
    assert fitted.round_s([0, 0]) == pytest.approx(fitted.plain_scale * fitted.base_round_s([0, 0]))


def test_rounds_that_read_prompts_do_not_calibrate_their_kind():
    """A full batch decoding plainly only in the rounds that read a long prompt (the round-time
    bound trims drafts there): those rounds took 1.25x their prediction, the prompt's price
    being off (a forward of its own), while plain decoding's own rounds took what was
    predicted. Calibrated on them, plain decoding was priced 1.2x dear (the old code); it
    is calibrated on the prompt-free rounds alone, as the plan prices rounds."""
    window = timed_rounds(n=50)
    prompt_round = RoundShape(32, 32 + 250, 0, 0, prompts=2, prompt_tokens=250)
    for _ in range(40):
        add_round_timing(window.add, prompt_round, 0.100, 0.0, 1.25 * 0.100, planned_s=0.100)
        add_round_timing(window.add, RoundShape(32, 96, 32, 2, prompts=1, prompt_tokens=32), 0.08, 0.04,
                         1.25 * 0.120, planned_s=0.120)
    for _ in range(10):
        add_round_timing(window.add, RoundShape(32, 32, 0, 0), 0.060, 0.0, 0.060, planned_s=0.060)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.plain_scale == pytest.approx(1.0)
    assert fitted.drafting_scale == 1.0  # no prompt-free drafting round: the parts are the prediction


def test_a_planned_drafting_round_whose_proposer_drafted_nothing_calibrates_drafting_rounds():
    """round_s priced it as a drafting round (its plan asked for drafts); had it counted as
    plain, its planned draft call would pull the plain rounds' scale down."""
    window = timed_rounds(n=50)
    for _ in range(40):
        add_round_timing(window.add, RoundShape(1, 1, 1, 4), 0.010, 0.002, 0.012, planned_s=0.024)
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.plain_scale == 1.0
    assert fitted.drafting_scale == pytest.approx(
        (40 * 0.012 + CALIBRATION_PRIOR_S) / (40 * 0.024 + CALIBRATION_PRIOR_S))


def test_without_planned_rounds_the_parts_are_the_prediction():
    fitted = RoundCostModel.from_sums(timed_rounds(n=50).sums)
    assert (fitted.drafting_scale, fitted.plain_scale) == (1.0, 1.0)
    assert fitted.round_s([2, 0]) == fitted.base_round_s([2, 0])


def test_a_calibration_far_off_is_bounded():
    window = timed_rounds(n=50)
    for _ in range(200):
        add_round_timing(window.add, RoundShape(1, 5, 1, 4), 0.01, 0.01, 2.0, planned_s=0.02)
    assert RoundCostModel.from_sums(window.sums).drafting_scale == CALIBRATION_LIMITS[1]
    with pytest.raises(ValueError, match="scales"):
        RoundCostModel(verify=(0.01, 0.001), draft=(0.0, 0.0, 0.0), plain_scale=0.0)


def test_what_rows_wait_between_emissions_scales_the_decoding_round_they_wait_for():
    """10 rows a round waited 0.030 s each where their plan predicted a 0.024 s decoding round
    (the prompt rounds between, the loop): a row's wait per round is 1.25x its decoding round,
    shrunk towards 1 while few rounds are measured; its rounds are priced as before."""
    window = timed_rounds(n=50)
    before = RoundCostModel.from_sums(window.sums)
    assert before.wait_scale == 1.0 and before.row_wait_s([2, 0]) == before.round_s([2, 0])
    for _ in range(100):
        add_row_waits(window.add, 10, 10 * 0.030, 0.024)
    add_row_waits(window.add, 0, 0.0, 0.024)  # no row had emitted before: nothing to count
    add_row_waits(window.add, 5, 1.0, 0.0)  # not a priced plan: nothing to set it against
    fitted = RoundCostModel.from_sums(window.sums)
    assert fitted.wait_scale == pytest.approx((100 * 0.300 + WAIT_PRIOR_S) / (100 * 0.240 + WAIT_PRIOR_S))
    assert fitted.row_wait_s([2, 0]) == pytest.approx(fitted.wait_scale * fitted.round_s([2, 0]))
    assert fitted.round_s([2, 0]) == before.round_s([2, 0])
    assert all(is_cost_key(key) for key in window.sums)  # kept over the cost window, summed over replicas
    thin = timed_rounds(n=50)
    add_row_waits(thin.add, 1, 0.030, 0.024)
    assert 1.0 < RoundCostModel.from_sums(thin.sums).wait_scale < 1.01
