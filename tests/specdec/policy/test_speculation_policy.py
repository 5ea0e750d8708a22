"""The policy: per-row γ by goodput from measured costs, request overrides, the on/off state
(hysteresis, dwell, the operator's override), exploration, fallback without fresh data."""

import random
from dataclasses import replace

import numpy as np
import pytest

from specdec.policy.load_stats import LoadSnapshot, RoundSample, StatsWindow
from specdec.policy.load_switch import LoadThresholds
from specdec.policy.round_cost import RoundCostModel
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import SpeculationPolicy, fixed_plan

CHEAP_VERIFY = RoundCostModel(verify=(0.010, 0.0018), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
HEAVY_VERIFY = RoundCostModel(verify=(0.010, 0.0049), draft=(0.001, 0.003, 0.0003), overhead_s=0.0005)
# the emulated H100 pair at time scale 8 after plain rounds of 32 rows (as in test_gamma.py)
AFTER_PLAIN_32 = RoundCostModel(verify=(0.060, 0.0003, 0.0001, 0.0001, 0.002), draft=(0.004, 0.011, 0.00005, 0.0),
                                overhead_s=0.002, verify_tokens_high=47.6)


def settings(**kw):
    base = dict(gamma_max=8, fallback_gamma=2, stale_after_s=5.0, min_gain=0.05, min_dwell_s=1.0, explore_interval_s=0)
    base.update(kw)
    return PolicySettings(**base)


def snapshot(alpha=0.7, cost=CHEAP_VERIFY, at=100.0, qps=1.0, in_flight=1.0, noise=0.0, rng=None):
    """A snapshot measured from rounds timed by `cost` (± noise), with acceptance α per token."""
    rng = rng or random.Random(0)
    w = StatsWindow()
    w.add_arrival(int(qps * 10))
    for rows in (1, 2, 4, 8, 16):
        for gamma in (0, 1, 2, 4):
            gammas = [gamma] * rows
            accepted = [_accepted(alpha, gamma, rng) for _ in range(rows)]
            jitter = 1 + rng.uniform(-noise, noise)
            verify = cost.verify_s(rows * (gamma + 1)) * jitter
            draft = cost.draft_s(rows, gamma) * jitter
            w.add_round(RoundSample.from_rows(gammas, gammas, accepted, draft, verify,
                                              verify + draft + cost.overhead_s))
    return LoadSnapshot.from_window(w, 10.0, in_flight, 0, measured_at=at)


def _accepted(alpha, gamma, rng):
    n = 0
    while n < gamma and rng.random() < alpha:
        n += 1
    return n


def auto(n, cap=8, **kw):
    return [RowState("auto", None, cap, seq_id=f"s{i}", **kw) for i in range(n)]


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
    rows = [RowState("auto", None, 8), RowState("on", 5, 8), RowState("off", None, 8), RowState("auto", 0, 8)]
    assert fixed_plan(rows, 4).gammas == (4, 5, 0, 0)
    assert fixed_plan(rows, 0).gammas == (0, 5, 0, 0)  # a server without speculation: AUTO stays plain


def test_the_operators_load_override_forces_speculation_off_with_hysteresis():
    t = LoadThresholds(disable_qps=10, enable_qps=5, disable_in_flight=64, enable_in_flight=32, min_dwell_s=0)
    policy = SpeculationPolicy(settings(thresholds=t))
    rows = [*auto(1), RowState("auto", 4, 8)]
    assert policy.update_switch(snapshot(qps=20), 1, 100.0) is False
    off = policy.plan(snapshot(alpha=0.95, qps=20), rows, 100.0, 4)
    assert off.gammas == (0, 0) and not off.enabled and "load high" in off.reason
    assert policy.update_switch(snapshot(qps=7), 1, 101.0) is False  # hysteresis band
    assert policy.update_switch(snapshot(qps=1), 1, 102.0) is True
    assert policy.plan(snapshot(alpha=0.95, qps=1), rows, 102.0, 4).gammas[1] == 4


def test_the_on_off_state_follows_the_plan_at_the_current_batch_with_dwell_and_hysteresis():
    policy = SpeculationPolicy(settings(min_dwell_s=2.0))
    snap = snapshot(alpha=0.8, cost=HEAVY_VERIFY)
    rows = SpeculationPolicy(settings(min_gain=0.0)).crossover(snap).rows  # where speculating gains nothing
    assert policy.update_switch(snap, 1, 100.0) is True
    assert policy.update_switch(snap, rows - 1, 100.2) is True  # on stays on while it gains (hysteresis)
    assert policy.update_switch(snap, rows, 100.5) is False  # the batch grew past the crossover
    off = policy.plan(snap, auto(1), 100.6, 4)
    assert off.gammas == (0,) and not off.enabled and "does not pay" in off.reason
    assert policy.update_switch(snap, 1, 101.0) is False  # within the dwell time
    assert policy.update_switch(snap, 1, 102.6) is True
    assert max(policy.plan(snap, auto(1), 102.7, 4).gammas) > 0


def test_the_on_off_state_is_judged_at_the_batch_the_demand_keeps_in_flight():
    """Little's law: the tokens/s the replicas emit, over the rows plain decoding would need
    for them on one replica (each row a token per round). Which policy serves the demand does
    not change it, so its batch is where both policies' steady states lie."""
    policy = SpeculationPolicy(settings())
    snap = snapshot(alpha=0.8, cost=HEAVY_VERIFY)
    cost = snap.round_cost
    for rows in (1, 6, 20):
        demand = rows / cost.round_s([0] * rows)
        assert policy.steady_rows(replace(snap, token_rate=demand)) == rows
        assert policy.steady_rows(replace(snap, token_rate=3 * demand, replicas=3)) == rows  # each its share
    assert policy.steady_rows(replace(snap, token_rate=0.0)) == 1  # idle: a lone request's case
    assert policy.steady_rows(replace(snap, token_rate=2 / cost.verify[1])) is None  # plain cannot keep up
    assert SpeculationPolicy(settings()).steady_rows(replace(snap, round_cost=None)) is None  # not measured
    crossover = policy.crossover(replace(snap, qps=4.0, token_rate=4.0 * 48, replicas=2))  # 48 tokens a request
    at_crossover = crossover.rows / cost.round_s([0] * crossover.rows)  # tokens/s one replica's crossover batch emits
    assert crossover.qps == pytest.approx(2 * at_crossover / 48)
    assert policy.steady_rows(replace(snap, token_rate=crossover.qps * 48, replicas=2)) == crossover.rows


def test_noisy_measurements_near_the_crossover_do_not_flap():
    """Timings ±15 % around a batch where speculation barely pays: over 20 s of updates
    every 100 ms, the state changes at most once per dwell time."""
    policy = SpeculationPolicy(settings(min_dwell_s=2.0))
    rows = policy.crossover(snapshot(alpha=0.7, cost=HEAVY_VERIFY)).rows - 1
    rng = random.Random(3)
    states = []
    for k in range(200):
        now = 100.0 + 0.1 * k
        states.append(policy.update_switch(
            snapshot(alpha=0.7, cost=HEAVY_VERIFY, at=now, noise=0.15, rng=rng), rows, now))
    changes = sum(a != b for a, b in zip(states, states[1:]))
    assert changes <= 20 / 2.0


def test_while_drafts_are_few_one_round_per_interval_explores_at_several_gammas():
    from dataclasses import replace

    measured = snapshot(alpha=0.05)
    policy = SpeculationPolicy(settings(explore_interval_s=2.0, explore_gamma=2, explore_rows=2))
    assert not any(any(policy.plan(measured, auto(3), 100.0 + 0.5 * t, 4).gammas) for t in range(8))  # enough data
    policy = SpeculationPolicy(settings(explore_interval_s=2.0, explore_gamma=2, explore_rows=2))
    snap = replace(measured, drafted=10, draft_calls=3)  # a window short of drafts
    rows = auto(3)
    times = [98.0 + 0.25 * k for k in range(24)]  # 6 s of rounds, 4 per second
    plans = [policy.plan(replace(snap, measured_at=t), rows, t, 4).gammas for t in times]
    exploring = [times[k] for k, g in enumerate(plans) if any(g)]
    assert exploring == [98.0, 100.0, 102.0]  # one round per 2 s, however many rounds
    assert all(sum(1 for x in g if x) == 2 for g in plans if any(g))  # two rows each
    assert [max(g) for g in plans if any(g)] == [1, 2, 1]  # γ cycles
    assert {i for g in plans for i, x in enumerate(g) if x} == {0, 1}  # the oldest rows
    assert policy.plan(snap, rows, 104.0, 4).gamma == 0  # the reported γ does not count exploration
    later = replace(snap, measured_at=110.0)
    preview = [policy.plan(later, rows, 108.0 + t, 4, update_state=False).gammas for t in range(4)]
    assert not any(any(g) for g in preview)  # previews do not explore
    assert policy.plan(later, [RowState("off", None, 8)] * 3, 110.0, 4).gammas == (0, 0, 0)


def test_acceptance_and_costs_are_remembered_while_the_window_has_no_drafts():
    """Off under load, the window soon holds no drafts: the last measured acceptance and
    cost model still decide, so speculation comes back when the load drops."""
    from dataclasses import replace

    policy = SpeculationPolicy(settings(min_dwell_s=0.0))
    snap = snapshot(alpha=0.8, cost=HEAVY_VERIFY)
    assert policy.update_switch(snap, 32, 100.0) is False  # off at 32 rows
    empty = replace(snap, alpha=None, alpha_per_position=(), round_cost=None, measured_at=110.0)
    assert policy.crossover(empty).rows is not None
    assert policy.update_switch(empty, 1, 110.0) is True  # a lone request: speculating pays again
    assert policy.plan(empty, auto(1), 110.0, 4).gammas[0] > 0
    forgetful = SpeculationPolicy(settings(min_dwell_s=0.0))  # never measured: nothing to remember
    assert forgetful.crossover(empty).rows is None
    assert forgetful.plan(empty, auto(1), 110.0, 4).gammas == (2,)  # the fallback γ


def test_a_thin_window_does_not_switch_speculation_off_on_a_few_unlucky_drafts():
    """Between requests at low load the window may hold a handful of drafts; their
    acceptance is a coin toss and only moves the remembered α by its count. A window that
    really measured a low acceptance does switch speculation off."""
    from dataclasses import replace

    policy = SpeculationPolicy(settings(min_dwell_s=0.0))
    measured = snapshot(alpha=0.8)
    assert policy.update_switch(measured, 1, 100.0) is True
    unlucky = replace(measured, alpha=0.1, alpha_per_position=(0.1,), drafted=6.0, draft_calls=3.0, measured_at=101.0)
    assert policy.update_switch(unlucky, 1, 101.0) is True
    kept = policy.remembered(unlucky)
    assert kept.alpha == pytest.approx((0.1 * 6 + measured.alpha * 64) / 70)
    assert kept.alpha_per_position == measured.alpha_per_position
    assert policy.plan(unlucky, auto(1), 101.0, 4).gammas[0] > 0
    low = snapshot(alpha=0.1, at=102.0)
    assert low.drafted >= 64 and policy.update_switch(low, 1, 102.0) is False


def test_once_off_it_stays_off_while_measurements_thin_out():
    """Off at a large batch, few draft calls remain in the window (exploration only): too
    few for a cost model, but that is no reason to fall back to speculating."""
    from dataclasses import replace

    policy = SpeculationPolicy(settings())
    snap = snapshot(alpha=0.8, cost=HEAVY_VERIFY)
    assert policy.update_switch(snap, 32, 100.0) is False
    thin = replace(snap, round_cost=None)
    assert policy.plan(thin, auto(32), 100.5, 4).gammas == (0,) * 32
    assert SpeculationPolicy(settings()).plan(thin, auto(2), 100.5, 4).gammas == (2, 2)  # on: the fallback γ


def test_after_a_stretch_of_plain_rounds_drafting_is_priced_as_last_measured():
    """Speculation off for a while: the window's model is fitted on plain rounds and a few
    exploration calls (dear: one row, an idle worker) and its trust region shrank to plain
    forwards. Taken as it is, drafting never pays again at 2 rows; priced as last measured
    while rows drafted, it does. Where the last measurement said it does not pay, it stays off."""
    explored = RoundCostModel(verify=(0.010, 0.0018, 0.0018, 0.0018), draft=(0.025, 0.003, 0.0003),
                              overhead_s=0.0005, verify_tokens_high=4.0, draft_tokens_high=4.0)
    thin = dict(round_cost=explored, drafted=10.0, draft_calls=3.0, measured_at=130.0)
    policy = SpeculationPolicy(settings(min_dwell_s=0.0))
    measured = snapshot(alpha=0.8)
    assert policy.update_switch(measured, 2, 100.0) is True
    after_plain = replace(measured, **thin)
    # nothing measured before
    assert SpeculationPolicy(settings()).plan(after_plain, auto(2), 130.0, 4).gammas == (0, 0)
    assert all(policy.plan(after_plain, auto(2), 130.0, 4).gammas)
    assert policy.update_switch(after_plain, 2, 130.0) is True
    heavy = SpeculationPolicy(settings(min_dwell_s=0.0))
    assert heavy.update_switch(snapshot(alpha=0.8, cost=HEAVY_VERIFY), 32, 100.0) is False
    cheap_exploring = replace(explored, draft=(0.0, 0.0, 0.0), verify_tokens_high=400.0, draft_tokens_high=400.0)
    assert heavy.update_switch(replace(measured, **{**thin, "round_cost": cheap_exploring}), 32, 130.0) is False


def test_after_a_plain_period_the_plan_turns_speculation_back_on_where_on_wins():
    """Requests queue at 32 rows (every round must gain min_gain) after OFF-like plain rounds:
    the cost model, drafting as last measured, says γ 3 for all streams 45 % faster, but its
    trust region covers only about 15 drafts. The plan and the on/off state judge the
    untrimmed plan, so rounds draft again (within the region, which their rounds widen),
    under a TPOT target too; where drafting does not pay untrimmed either, rounds stay plain."""
    snap = replace(snapshot(alpha=0.7), round_cost=AFTER_PLAIN_32, queued=4.0)
    for target in (None, 0.075):
        policy = SpeculationPolicy(settings(min_dwell_s=0.0, tpot_target_s=target))
        assert policy.update_switch(snap, 32, 100.0) is True
        d = policy.plan(snap, auto(32), 100.0, 4)
        assert 0 < sum(d.gammas) <= AFTER_PLAIN_32.drafted_limit(32), d.reason
        assert "untrimmed: the trust region allows 16 drafts" in d.reason
    dear = replace(AFTER_PLAIN_32, draft=(0.004, 0.050, 0.00005, 0.0))
    policy = SpeculationPolicy(settings(min_dwell_s=0.0))
    assert policy.plan(replace(snap, round_cost=dear), auto(32), 100.0, 4).gammas == (0,) * 32


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
