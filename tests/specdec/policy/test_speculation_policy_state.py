"""The policy's on/off state (hysteresis, dwell, the operator's override, the batch it is judged
at, no flapping near the crossover), exploration while drafts are few, and what it remembers
while the window holds no drafts."""

import random
from dataclasses import replace

import pytest

from specdec.policy.load_switch import LoadThresholds
from specdec.policy.round_cost import RoundCostModel
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import SpeculationPolicy
from policy_snapshots import AFTER_PLAIN_32, HEAVY_VERIFY, auto, settings, snapshot


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
