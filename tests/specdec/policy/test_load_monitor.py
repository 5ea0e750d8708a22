"""The load monitor decides from shared measurements, off the request path, and survives store outages."""

import pytest

from specdec.policy.load_monitor import LoadMonitor
from specdec.policy.load_stats import RoundSample
from specdec.policy.load_store import InProcessLoadStore
from specdec.policy.load_switch import LoadThresholds
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import SpeculationPolicy


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def settings(**kw):
    base = dict(gamma_max=6, fallback_gamma=2, stale_after_s=3.0, min_gain=0.0, min_dwell_s=1.0, explore_interval_s=0,
                thresholds=LoadThresholds(disable_qps=5, enable_qps=2, disable_in_flight=100, enable_in_flight=50,
                                          min_dwell_s=1.0))
    base.update(kw)
    return PolicySettings(**base)


def record_good_rounds(m, n=16):
    """Enough rounds for the cost model (MIN_ROUNDS) at once."""
    for _ in range(n):
        m.record(good_round())


def record_varied_rounds(m, batches):
    """Rounds of each batch size at γ 0, 2 and 4, verify growing 3 ms per token, α about 0.5."""
    for rows in batches:
        for gamma in (0, 2, 4):
            m.record(RoundSample(rows, gamma, rows * gamma, int(0.5 * rows * gamma), 0.001 + 0.003 * gamma,
                                 0.010 + 0.003 * rows * (gamma + 1), accepted_per_position=(70, 49, 34, 24)[:gamma],
                                 drafted_per_position=(100,) * gamma))


def good_round():
    return RoundSample(1, 4, drafted=4, accepted=4, draft_seconds=0.002, verify_seconds=0.011,
                       accepted_per_position=(1, 1, 1, 1), drafted_per_position=(1, 1, 1, 1))


def decide(m, rows=1):
    """The monitor's plan for `rows` AUTO requests."""
    return m.plan([RowState("auto", None, 8, seq_id=f"s{i}") for i in range(rows)], default_gamma=4)


def monitor(store, clock, replica="r1", **kw):
    return LoadMonitor(store, SpeculationPolicy(settings(**kw)), replica, window_s=10.0, clock=clock)


class FlakyStore(InProcessLoadStore):
    def __init__(self):
        super().__init__(window_s=10.0)
        self.down = False
        self.calls = 0

    def push(self, *args, **kwargs):
        self.calls += 1
        if self.down:
            raise ConnectionError("redis down")
        return super().push(*args, **kwargs)


class SlowStore(InProcessLoadStore):
    """Applies a push, then times out (the reply was lost) while `late` is set."""

    def __init__(self):
        super().__init__(window_s=10.0)
        self.late = False

    def push(self, *args, **kwargs):
        applied = super().push(*args, **kwargs)
        if self.late:
            raise TimeoutError("Timeout reading from redis")
        return applied


def test_without_measurements_the_fallback_gamma_is_used():
    assert decide(monitor(InProcessLoadStore(), Clock())).gamma == 2


def test_measured_acceptance_drives_gamma_after_a_tick():
    clock = Clock()
    m = monitor(InProcessLoadStore(), clock)
    record_good_rounds(m)
    m.tick()
    d = decide(m)
    assert d.enabled and d.gamma == 6


def test_decide_and_record_never_touch_the_store():
    store, clock = FlakyStore(), Clock()
    m = monitor(store, clock)
    for _ in range(100):
        m.on_arrival()
        m.record(good_round())
        decide(m)
    assert store.calls == 0
    m.tick()
    assert store.calls == 1  # one batched push


def test_high_qps_switches_off_for_every_replica_sharing_the_store():
    store, clock = InProcessLoadStore(), Clock()
    a, b = monitor(store, clock, "a"), monitor(store, clock, "b")
    record_good_rounds(a)
    a.on_arrival(40)  # 4 qps over the 10 s window ...
    b.on_arrival(40)  # ... plus 4 from the other replica: 8 > 5
    a.tick()
    b.tick()
    a.tick()
    assert not decide(a).enabled and not decide(b).enabled
    assert decide(a).gamma == 0 and decide(b).gamma == 0
    clock.now += 11  # the burst leaves the window
    a.tick()
    b.tick()
    assert decide(a).enabled and decide(b).enabled


def test_a_store_outage_falls_back_to_local_measurements_and_recovers():
    store, clock = FlakyStore(), Clock()
    m = monitor(store, clock)
    m.tick()
    assert m.source == "shared"
    store.down = True
    for _ in range(5):
        record_good_rounds(m, 4)
        clock.now += 0.1
        m.tick()
    assert m.source == "local"
    assert m.breaker.state(clock()) == "open"
    assert decide(m).gamma == 6  # decisions continue from local measurements
    calls = store.calls
    clock.now += 0.1
    m.tick()
    assert store.calls == calls  # the open circuit skips the store
    store.down = False
    clock.now += 2.0
    m.tick()
    assert m.source == "shared" and m.breaker.state(clock()) == "closed"
    assert store.snapshot(clock()).alpha == 1.0  # what was measured during the outage reached the store


def test_stale_shared_measurements_fall_back():
    clock = Clock()
    m = monitor(InProcessLoadStore(), clock)
    m.record(good_round())
    m.tick()
    clock.now += 5.0  # no tick for longer than stale_after_s
    assert decide(m).gamma == 2


def test_the_background_thread_ticks_until_stopped():
    import time

    m = LoadMonitor(InProcessLoadStore(), SpeculationPolicy(settings()), "t", refresh_s=0.01)
    m.record(good_round())
    m.start()
    deadline = time.time() + 5
    while m.snapshot is None and time.time() < deadline:
        time.sleep(0.01)
    m.stop()
    assert m.snapshot is not None and m.snapshot.alpha == 1.0


def test_a_push_that_timed_out_after_the_store_applied_it_counts_once():
    """A hung Redis that executed the push but answered too late: the monitor retries the
    same batch (same id), which the store ignores, so QPS is not inflated."""
    clock = Clock()
    store = SlowStore()
    m = monitor(store, clock)  # one failure does not open the breaker
    m.on_arrival(10)
    store.late = True
    m.tick()  # applied, but the reply timed out
    store.late = False
    clock.now += 1.0
    m.on_arrival(5)
    m.tick()  # retries the first batch (ignored: already applied), then pushes the second
    assert store.snapshot(clock.now).qps == pytest.approx(15 / 10.0)
    assert m.source == "shared"


def test_without_a_store_or_thread_the_monitor_ticks_inline_on_record():
    """The in-process engine's monitor: no thread, measurements refresh as rounds are recorded."""
    clock = Clock()
    m = LoadMonitor(None, SpeculationPolicy(settings(thresholds=None)), "in-process", refresh_s=0.1, clock=clock)
    record_good_rounds(m, 15)
    clock.now += 0.2
    m.record(good_round())  # due: the 16th round ticks
    first = m.snapshot
    assert first is not None and first.alpha == 1.0 and first.round_cost is not None
    m.record(RoundSample(1, 0, 0, 0, 0.0, 0.009))
    assert m.snapshot is first  # not due yet
    clock.now += 0.2
    m.record(RoundSample(1, 0, 0, 0, 0.0, 0.009))
    assert m.snapshot is not first and m.snapshot.mean_accepted_length == pytest.approx((16 * 5 + 2) / 18)


def test_status_reports_the_cost_model_and_the_crossover():
    clock = Clock()
    m = monitor(InProcessLoadStore(), clock, thresholds=None)
    record_varied_rounds(m, (1, 2, 4, 1, 2, 4))
    m.tick()
    m.set_load(1, 0)
    status = m.status()
    assert status.round_cost.verify[1] == pytest.approx(0.003, rel=0.01)
    assert status.crossover.rows is not None and status.crossover.rows > 1
    assert status.speculation_enabled and status.gamma > 0 and not status.off_because_of_load
    m.set_load(status.crossover.rows, 0)  # the status previews the plan at the current load
    assert m.status().off_because_of_load and m.status().gamma == 0


def test_the_crossover_is_recomputed_at_most_once_a_second():
    clock = Clock()
    m = monitor(InProcessLoadStore(), clock, thresholds=None)
    calls = []
    real = m.policy.crossover
    m.policy.crossover = lambda snap: calls.append(snap) or real(snap)
    for _ in range(10):
        m.status()
    clock.now += 1.0
    m.status()
    assert len(calls) == 2


def test_the_switch_follows_the_demand_not_a_passing_burst_of_rows():
    """Rounds of 1-4 rows, then a burst of large plain rounds: the window's mean batch passes
    the crossover, but the tokens/s it emitted would keep fewer rows than that in flight, so
    speculation stays on (the rounds' own plans draft less in large batches). A demand that
    would keep more rows in flight than the crossover switches it off, whatever the batch."""
    clock = Clock()
    m = monitor(InProcessLoadStore(), clock, thresholds=None)
    record_varied_rounds(m, (1, 2, 4, 1, 2, 4))
    m.tick()
    crossover = m.status().crossover.rows
    assert crossover is not None and m.policy.switch.enabled
    burst = crossover + 4
    for _ in range(40):
        m.record(RoundSample(burst, 0, 0, 0, 0.0, 0.010 + 0.003 * burst))
    m.set_load(burst, 0)
    clock.now += 2.0
    m.tick()
    assert m.snapshot.mean_batch > crossover and m.policy.steady_rows(m.snapshot) < crossover
    assert m.policy.switch.enabled
    for _ in range(int(10.0 / (0.010 + 0.003 * burst)) - 40):  # sustained: the window's 10 s at the rounds' pace
        m.record(RoundSample(burst, 0, 0, 0, 0.0, 0.010 + 0.003 * burst))
    clock.now += 2.0
    m.tick()
    assert m.policy.steady_rows(m.snapshot) > crossover and not m.policy.switch.enabled


def test_the_configured_tpot_target_is_the_policys_default_in_seconds():
    from specdec.config.config import LoadMonitorConfig
    from specdec.policy.load_monitor import build_load_monitor

    assert build_load_monitor(LoadMonitorConfig(), None, "r").policy.settings.tpot_target_s is None
    targeted = build_load_monitor(LoadMonitorConfig(tpot_target_ms=25.0), None, "r")
    assert targeted.policy.settings.tpot_target_s == pytest.approx(0.025)


def test_a_plan_made_ahead_counts_no_round_and_the_next_round_takes_it():
    """`plan_ahead` (the planner's worker thread) plans from the snapshot without exploring;
    `plan(ahead=…)` takes it for the same rows, as planning in place would have planned."""
    clock = Clock()
    m = monitor(InProcessLoadStore(), clock, thresholds=None, explore_interval_s=1.0)
    record_good_rounds(m)
    m.tick()
    rows = [RowState("auto", None, 8, seq_id=f"s{i}") for i in range(2)]
    ahead = m.plan_ahead(rows, 4)
    assert m.policy.explorations == 0 and ahead.catch_up and any(ahead.gammas)
    assert m.plan(rows, 4, ahead=ahead) == m.plan(rows, 4)
