"""The policy: per-row γ by goodput from measured costs, request overrides, fallback without
fresh data, plans made ahead, TPOT targets (the on/off state and exploration:
test_speculation_policy_state.py)."""

from dataclasses import replace

import numpy as np
import pytest

from specdec.policy.load_stats import LoadSnapshot
from specdec.policy.round_cost import RoundCostModel
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import SpeculationPolicy, fixed_plan
from policy_snapshots import HEAVY_VERIFY, auto, settings, snapshot


def test_missing_or_stale_measurements_fall_back_to_the_safe_gamma():
    policy = SpeculationPolicy(settings())
    assert policy.plan(None, auto(2), 100.0, 4).gammas == (2, 2)
    stale = policy.plan(snapshot(at=90.0), auto(1), 100.0, 4)
    assert stale.gammas == (2,) and "no fresh measurements" in stale.reason


def test_good_acceptance_and_cheap_drafts_speculate():
    d = SpeculationPolicy(settings()).plan(snapshot(alpha=0.9), auto(1), 100.0, 4)
    assert d.enabled and d.gammas[0] >= 3 and "goodput plan" in d.reason


def test_the_round_time_bound_shortens_what_the_plan_drafts_and_where_it_pays():
    """A draft step as dear as a third of the verify: goodput alone drafts long rounds, the
    bound keeps each round within 1.5 plain ones (measured through the window's fit)."""
    dear_steps = RoundCostModel(verify=(0.010, 0.0005), draft=(0.0005, 0.003, 0.0), overhead_s=0.0005)
    measured = snapshot(alpha=0.95, cost=dear_steps)
    free = SpeculationPolicy(settings()).plan(measured, auto(1), 100.0, 4)
    bounded_policy = SpeculationPolicy(settings(max_round_ratio=1.5))
    bounded = bounded_policy.plan(measured, auto(1), 100.0, 4)
    fit = measured.round_cost
    assert fit.round_s(free.gammas) > 1.5 * fit.round_s((0,))
    assert 0 < bounded.gammas[0] < free.gammas[0] and fit.round_s(bounded.gammas) <= 1.5 * fit.round_s((0,))


def test_poor_acceptance_means_plain_decoding():
    d = SpeculationPolicy(settings()).plan(snapshot(alpha=0.05), auto(4), 100.0, 4)
    assert d.gammas == (0, 0, 0, 0) and d.gamma == 0


def test_a_large_batch_turns_speculation_off_from_the_measured_costs():
    policy = SpeculationPolicy(settings())
    snap = snapshot(alpha=0.85, cost=HEAVY_VERIFY)
    assert max(policy.plan(snap, auto(1), 100.0, 4).gammas) > 0
    assert policy.plan(snap, auto(16), 100.0, 4).gammas == (0,) * 16
    assert policy.crossover(snap).rows is not None and 1 < policy.crossover(snap).rows <= 16


def test_a_round_speculates_only_for_a_predicted_gain_of_min_gain():
    """A plan within a few per cent of plain decoding is inside the cost model's error, and
    its longer rounds are a sure cost to everyone's latency: it decodes plainly."""
    snap = snapshot(alpha=0.7, cost=HEAVY_VERIFY)
    marginal = SpeculationPolicy(settings(min_gain=0.0)).plan(snap, auto(1), 100.0, 4)
    assert marginal.gammas[0] > 0
    plan = SpeculationPolicy(settings(min_gain=0.05)).plan(snap, auto(1), 100.0, 4)
    assert plan.gammas == (0,) and SpeculationPolicy(settings(min_gain=0.05)).crossover(snap).rows == 1


def test_within_the_cost_models_error_the_on_off_state_decides_for_rounds_of_its_batch():
    """At one row the cluster's α 0.5 gains 3 % (on); a row whose own acceptance makes it
    0.41 would be 3 % slower drafting, within min_gain of plain decoding: a round of the
    batch the state judged drafts for it, a burst of two such rows does not, nor any round
    while requests queue (throughput counts there) or before the state was judged."""
    cost = RoundCostModel(verify=(0.010, 0.001), draft=(0.001, 0.003, 0.0))
    snap = LoadSnapshot(qps=1.0, in_flight=1.0, queued=0.0, alpha=0.5, alpha_per_position=(),
                        mean_accepted_length=None, round_cost=cost, measured_at=100.0, drafted=1000, draft_calls=100)
    weaker = RowState("auto", None, 8, drafted=400, accepted=146, seq_id="weaker")  # α 0.5 × (146 + 100) / 300
    policy = SpeculationPolicy(settings(min_gain=0.05))
    assert policy.plan(snap, [weaker], 100.0, 4).gammas == (0,)  # not judged yet
    assert policy.update_switch(snap, 1, 100.0) and policy.judged_rows == 1
    assert policy.plan(snap, [weaker], 100.0, 4).gammas == (1,)
    assert policy.plan(snap, [weaker, replace(weaker, seq_id="other")], 100.0, 4).gammas == (0, 0)
    queued = replace(snap, queued=3.0)
    assert policy.update_switch(queued, 1, 100.0) and policy.plan(queued, [weaker], 100.0, 4).gammas == (0,)


def test_under_a_tpot_target_a_round_of_the_judged_batch_takes_the_plan_with_the_most_tokens_per_s():
    """The same row as above, drafting 3 % slower than plain decoding: without a target the
    judged batch's round drafts for it (the state decides within the error band); under a
    target that both plans meet, the objective decides: plain decoding, the lower TPOT. A
    row that gains from drafting still drafts under the same target (no bias against it)."""
    cost = RoundCostModel(verify=(0.010, 0.001), draft=(0.001, 0.003, 0.0))
    snap = LoadSnapshot(qps=1.0, in_flight=1.0, queued=0.0, alpha=0.5, alpha_per_position=(),
                        mean_accepted_length=None, round_cost=cost, measured_at=100.0, drafted=1000, draft_calls=100)
    weaker = RowState("auto", None, 8, drafted=400, accepted=146, seq_id="weaker", tpot_target_s=1.0)
    policy = SpeculationPolicy(settings(min_gain=0.05))
    assert policy.update_switch(snap, 1, 100.0) and policy.judged_rows == 1
    assert policy.plan(snap, [replace(weaker, tpot_target_s=None)], 100.0, 4).gammas == (1,)
    assert policy.plan(snap, [weaker], 100.0, 4).gammas == (0,)
    stronger = replace(weaker, accepted=300, seq_id="stronger")
    assert policy.plan(snap, [stronger], 100.0, 4).gammas[0] > 0


def test_a_row_uses_its_own_acceptance_shrunk_towards_the_clusters():
    snap = snapshot(alpha=0.5)
    rows = [RowState("auto", None, 8, drafted=400, accepted=390, seq_id="easy"),
            RowState("auto", None, 8, drafted=400, accepted=8, seq_id="hard")]
    gammas = SpeculationPolicy(settings()).plan(snap, rows, 100.0, 4).gammas
    assert gammas[0] >= 4 and gammas[1] == 0


def test_a_row_that_drafted_long_rounds_at_the_clusters_acceptance_plans_as_a_fresh_row():
    """Its drafts past each round's first rejection were never judged: measured against what
    the cluster's per-position acceptance expected of the positions it offered, it is an
    average row, not a poor one."""
    snap = snapshot(alpha=0.9)
    policy = SpeculationPolicy(settings())
    fresh = policy.plan(snap, auto(1), 100.0, 4).gammas
    curve = policy._cluster_curve(snap)
    accepted = round(10 * curve.sum())  # 10 rounds of 8 drafts, accepted as the cluster's rows are
    seasoned = RowState("auto", None, 8, drafted=80, accepted=accepted, seq_id="s", drafted_per_position=(10,) * 8)
    assert fresh[0] >= 4, fresh
    assert policy.plan(snap, [seasoned], 100.0, 4).gammas == fresh


def test_each_rows_acceptance_is_its_own_whichever_rows_share_its_round():
    """The rows' curves are computed together (every round's critical path): a row's
    P(first k accepted) is the same as when it is alone, whatever the others drafted and
    whether they say at which positions."""
    snap = snapshot(alpha=0.6)
    policy = SpeculationPolicy(settings())
    rows = [RowState("auto", None, 8, drafted=40, accepted=35, seq_id="easy", drafted_per_position=(10, 10, 10, 10)),
            RowState("auto", None, 8, drafted=300, accepted=20, seq_id="hard"),
            RowState("auto", None, 8, seq_id="fresh"),
            RowState("auto", None, 8, drafted=16, accepted=9, seq_id="short", drafted_per_position=(8, 8))]
    together = policy._curves(snap, rows)
    alone = np.stack([policy._curves(snap, [row])[0] for row in rows])
    assert together.shape == (4, 8)
    assert together == pytest.approx(alone)
    assert together[0, 0] > together[2, 0] > together[1, 0]  # easy above fresh (the cluster's) above hard


def test_one_unlucky_first_round_does_not_turn_an_average_request_off():
    """A request's first round says next to nothing about the rest of it: none of 8 drafts
    accepted leaves it speculating, close to a fresh request's γ."""
    snap = snapshot(alpha=0.9)
    policy = SpeculationPolicy(settings())
    unlucky = RowState("auto", None, 8, drafted=8, accepted=0, seq_id="u", drafted_per_position=(1,) * 8)
    fresh = policy.plan(snap, auto(1), 100.0, 4).gammas[0]
    assert fresh >= 4 and policy.plan(snap, [unlucky], 100.0, 4).gammas[0] >= fresh - 1


@pytest.mark.parametrize(
    "mode, requested, enabled_gamma",
    [
        ("off", 6, 0),
        ("on", 6, 6),
        ("on", None, 3),  # ON without a γ: the server's γ, whatever the plan says
        ("auto", 5, 5),  # an explicit γ overrides the plan
        ("auto", 0, 0),  # γ 0 means no speculation in any mode
        ("on", 0, 0),
    ],
)
def test_request_overrides_beat_the_plan(mode, requested, enabled_gamma):
    row = RowState(mode, requested, 8)
    for alpha in (0.0, 0.95):  # whatever the plan would say
        assert SpeculationPolicy(settings()).plan(snapshot(alpha=alpha), [row], 100.0, 3).gammas == (enabled_gamma,)


def test_overrides_are_cut_to_the_rows_cap():
    assert SpeculationPolicy(settings()).plan(snapshot(), [RowState("on", 6, 2)], 100.0, 3).gammas == (2,)


def test_a_round_of_requests_own_gammas_only_is_not_planned_but_priced(monkeypatch):
    """No row's γ is free: the rows keep their own γ without the goodput plan on the round's
    critical path, and the round is still priced (its time calibrates the cost model)."""
    import specdec.policy.speculation_policy as module

    def no_plan(*args, **kwargs):
        raise AssertionError("planned a round with no free γ")

    monkeypatch.setattr(module, "plan_gammas", no_plan)
    rows = [RowState("on", 4, 8, seq_id="a"), RowState("off", None, 8, seq_id="b"), RowState("auto", 2, 8, seq_id="c")]
    d = SpeculationPolicy(settings()).plan(snapshot(alpha=0.9), rows, 100.0, 3)
    assert d.gammas == (4, 0, 2) and d.enabled and d.planned_s is not None and "request's" in d.reason


@pytest.mark.parametrize("alpha", [0.0, 0.9])
def test_a_requests_own_gamma_above_gamma_max_is_its_own_and_its_neighbours_are_still_planned(alpha):
    """speculation.gamma_max (a request's cap, 16) may exceed the policy's gamma_max (8): the
    row keeps its γ, priced at gamma_max, and the other rows get the goodput plan."""
    def plan(own_gamma):
        rows = [*auto(2, cap=16), RowState("on", own_gamma, 16, seq_id="mine")]
        return SpeculationPolicy(settings()).plan(snapshot(alpha=alpha), rows, 100.0, 4)

    above, at_the_max = plan(12), plan(8)
    assert above.gammas == (*at_the_max.gammas[:2], 12) and "goodput plan" in above.reason


def test_an_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode"):
        SpeculationPolicy(settings()).plan(snapshot(), [RowState("sometimes", None, 8)], 100.0, 3)


def test_without_a_policy_rows_get_their_own_or_the_servers_gamma():
    asks = [("auto", None), ("on", 5), ("off", None), ("auto", 0)]  # (mode, requested γ)
    assert fixed_plan(asks, 4).gammas == (4, 5, 0, 0)
    assert fixed_plan(asks, 0).gammas == (0, 5, 0, 0)  # a server without speculation: AUTO stays plain


def test_a_plan_made_ahead_equals_the_plan_made_in_place_for_the_same_inputs():
    """`plan_ahead` (no round counted) then `plan(ahead=…)` gives the round what planning in
    place gives it: γ, reason, predicted seconds; caps, overrides and exploration are still
    the round's own, and a row that joined since drafts the γ the plan gave most rows."""
    snap = snapshot(alpha=0.8)
    rows = [RowState("auto", None, 8, drafted=40 + i, accepted=20 + 3 * i, seq_id=f"s{i}", catch_up_tokens=i,
                     remaining_tokens=30, tpot_target_s=0.05 if i % 2 else None) for i in range(6)]
    rows.append(RowState("on", None, 8, seq_id="fixed"))
    in_place = SpeculationPolicy(settings()).plan(snap, rows, 100.0, 4)
    policy = SpeculationPolicy(settings())
    ahead = policy.plan(snap, rows, 100.0, 4, update_state=False)
    taken = policy.plan(snap, rows, 100.0, 4, ahead=ahead)
    assert any(in_place.gammas) and taken == in_place
    capped = policy.plan(snap, [replace(rows[0], cap=1), *rows[1:]], 100.0, 4, ahead=ahead)
    assert capped.gammas[0] == min(1, in_place.gammas[0]), "a row's cap is this round's"
    from specdec.policy.ahead_plan import NEWCOMER

    joined = replace(ahead, gammas=(*ahead.gammas[:-2], NEWCOMER, NEWCOMER))  # two rows the plan did not see
    common = max(sorted(set(ahead.gammas[:-2])), key=ahead.gammas[:-2].count)
    newcomers = [replace(rows[0], seq_id="new", cap=1), RowState("off", None, 8, seq_id="new off")]
    taken = policy.plan(snap, [*rows[:-2], *newcomers], 100.0, 4, ahead=joined)
    assert taken.gammas[-2:] == (min(common, 1), 0), "the plan's most common γ, within its cap; an override wins"
    exploring = SpeculationPolicy(settings(explore_interval_s=2.0))
    thin = replace(snap, drafted=10, draft_calls=3)
    quiet = exploring.plan(thin, auto(2), 100.0, 4, update_state=False)
    assert exploring.explorations == 0 and quiet.planned_s > 0
    assert exploring.plan(thin, auto(2), 100.0, 4, ahead=quiet).planned_s == 0.0 and exploring.explorations == 1


def test_a_plan_records_its_predicted_round_and_exploration_does_not():
    from dataclasses import replace

    snap = snapshot(alpha=0.9)
    rows = [RowState("auto", None, 8, prompt_tokens=30, catch_up_tokens=31), RowState("auto", None, 8)]
    d = SpeculationPolicy(settings()).plan(snap, rows, 100.0, 4)
    assert d.planned_s == pytest.approx(snap.round_cost.base_round_s(d.gammas, 30, [31, 0]))
    exploring = SpeculationPolicy(settings(explore_interval_s=2.0))
    thin = replace(snapshot(alpha=0.05), drafted=10, draft_calls=3)
    d = exploring.plan(thin, auto(2), 100.0, 4)
    assert any(d.gammas) and d.planned_s == 0.0


def test_rounds_measured_faster_than_their_parts_turn_speculation_on():
    """The parts' sum says one row drafting does not pay; the planned drafting rounds took
    half of what it predicted (the look-ahead drafted them during the verify): it pays."""
    from dataclasses import replace

    dear_draft = RoundCostModel(verify=(0.010, 0.0018), draft=(0.012, 0.004, 0.0), overhead_s=0.0005)
    snap = snapshot(alpha=0.6, cost=dear_draft)
    policy = SpeculationPolicy(settings())
    assert policy.plan(snap, auto(1), 100.0, 4).gammas == (0,)
    calibrated = replace(snap, round_cost=replace(snap.round_cost, drafting_scale=0.5))
    assert policy.plan(calibrated, auto(1), 100.0, 4).gammas[0] > 0


def test_a_row_that_decoded_plainly_for_a_while_drafts_again_when_it_has_rounds_left_to_pay_its_catch_up():
    """The draft reads a row's history once: spread over the rounds the row has left, a long
    catch-up does not keep a row that has most of its answer to go from drafting, and
    still keeps one that is about to finish."""
    reading = RoundCostModel(verify=(0.010, 0.0003), draft=(0.001, 0.002, 0.0003, 0.0002))
    snap = replace(snapshot(alpha=0.8), round_cost=reading)  # a model that prices the catch-up
    policy = SpeculationPolicy(settings())
    behind = [RowState("auto", None, 8, catch_up_tokens=3)] * 2 + [RowState("auto", None, 8, catch_up_tokens=120)]
    many_left = [replace(r, remaining_tokens=200) for r in behind]
    few_left = [replace(r, remaining_tokens=3 if r.catch_up_tokens > 3 else 200) for r in behind]
    assert policy.plan(snap, behind, 100.0, 4).gammas[2] == 0  # remaining unknown: one round pays it all
    assert all(policy.plan(snap, many_left, 100.0, 4).gammas)
    assert policy.plan(snap, few_left, 100.0, 4).gammas[2] == 0
    assert policy.plan(snap, many_left, 100.0, 4).planned_s == pytest.approx(
        reading.base_round_s(policy.plan(snap, many_left, 100.0, 4).gammas, 0, [3, 3, 120]))  # the round pays it all



def two_rows(hard_target=None):
    """A row whose drafts are mostly accepted and one whose drafts mostly are not (it decodes
    plainly and pays the longer rounds of its neighbour's drafting)."""
    return [RowState("auto", None, 8, drafted=400, accepted=390, seq_id="easy"),
            RowState("auto", None, 8, drafted=400, accepted=8, seq_id="hard", tpot_target_s=hard_target)]


def test_the_servers_tpot_target_holds_for_rows_without_their_own_and_a_rows_own_target_wins():
    snap = snapshot(alpha=0.5)
    free = SpeculationPolicy(settings()).plan(snap, two_rows(), 100.0, 4)
    cost = SpeculationPolicy(settings()).remembered(snap).round_cost
    assert free.gammas[0] > 0 and free.gammas[1] == 0
    target = 1.4 * cost.round_s((0, 0))  # plain decoding meets it; the free plan's round does not
    assert cost.round_s(free.gammas) > target
    assert SpeculationPolicy(settings(tpot_target_s=target)).plan(snap, two_rows(), 100.0, 4).gammas == (0, 0)
    assert SpeculationPolicy(settings()).plan(snap, two_rows(target), 100.0, 4).gammas == (0, 0)
    loose_own = SpeculationPolicy(settings(tpot_target_s=target)).plan(snap, two_rows(10.0), 100.0, 4)
    assert loose_own.gammas == free.gammas, "the easy row meets the server's target; the hard row's own is loose"


def test_a_decision_says_when_no_plan_meets_the_targets():
    snap = snapshot(alpha=0.5)
    cost = SpeculationPolicy(settings()).remembered(snap).round_cost
    target = 0.5 * cost.round_s((0, 0))  # the hard row misses it in every plan
    missed = SpeculationPolicy(settings()).plan(snap, two_rows(target), 100.0, 4)
    assert missed.gammas[0] > 0 and missed.gammas[1] == 0, "the hard row's lost target does not hold the easy row back"
    assert f"TPOT targets missed by {cost.round_s(missed.gammas) / target:.2f}x" in missed.reason
