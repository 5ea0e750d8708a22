"""The shared load store in a real Redis: additive across replicas, TTL'd, atomic, and survivable."""

import time

import pytest

from redis_server import RedisServer
from specdec.policy.load_monitor import LoadMonitor
from specdec.policy.load_stats import RoundSample, StatsWindow
from specdec.policy.load_store import SwitchState
from specdec.policy.load_switch import LoadThresholds
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import SpeculationPolicy

from specdec_redis.redis_load_store import RedisLoadStore


@pytest.fixture
def store(redis_server, request):
    s = RedisLoadStore(redis_server.url, deployment=request.node.name, window_s=10.0, replica_ttl_s=2.0)
    yield s
    s.close()


def delta(arrivals=0, drafted=0, accepted=0):
    w = StatsWindow()
    w.add_arrival(arrivals)
    if drafted:
        w.add_round(RoundSample(1, drafted, drafted, accepted, 0.001, 0.01))
    return w


def test_two_replicas_add_up(store):
    now = time.time()
    store.push("a", delta(arrivals=30, drafted=4, accepted=3), now, in_flight=2, queued=1)
    store.push("b", delta(arrivals=20, drafted=4, accepted=1), now, in_flight=5, queued=0)
    snap = store.snapshot(now)
    assert snap.qps == pytest.approx(5.0)
    assert snap.alpha == pytest.approx(0.5)
    assert (snap.in_flight, snap.queued) == (7, 1)


def test_a_retried_push_is_applied_once(store):
    """The monitor retries a batch whose reply timed out with the same id: Redis ignores it."""
    now = time.time()
    assert store.push("a", delta(arrivals=30), now, 1, 0, push_id="a:7")
    assert not store.push("a", delta(arrivals=30), now, 1, 0, push_id="a:7")
    assert store.push("a", delta(arrivals=10), now, 1, 0, push_id="a:8")
    assert store.snapshot(now).qps == pytest.approx(4.0)
    assert store.client.ttl(f"{store.prefix}:push:a:7") > 0, "push markers age out"


def test_old_windows_and_dead_replicas_age_out(store):
    now = time.time()
    store.push("dead", delta(arrivals=100), now - 30, in_flight=9, queued=9)
    store.push("alive", delta(arrivals=10), now, in_flight=1, queued=0)
    snap = store.snapshot(now)
    assert snap.qps == pytest.approx(1.0) and snap.in_flight == 1


def test_the_cost_model_and_acceptance_outlive_the_load_window_for_every_replica(redis_server, request):
    """Round timings and acceptance are kept over cost_window_s: 30 s later the load window
    is empty, the cost model fitted on both replicas' rounds and their α are not."""
    stores = [RedisLoadStore(redis_server.url, deployment=request.node.name, window_s=10.0, cost_window_s=60.0)
              for _ in range(2)]
    now = time.time()
    for name, s in zip("ab", stores):
        w = StatsWindow()
        for gamma in (1, 2, 4, 8) * 4:
            w.add_round(RoundSample(1, gamma, gamma, 1, 0.008 + 0.001 * gamma, 0.01 + 0.0002 * gamma, draft_rows=1))
        w.add_arrival(5)
        s.push(name, w, now - 30, in_flight=1, queued=0)
    snap = stores[1].snapshot(now)
    assert snap.qps == 0.0 and snap.mean_batch == 0.0
    assert snap.drafted == 2 * 15 * 4 and snap.alpha == pytest.approx(2 * 16 / snap.drafted)  # one accepted a round
    assert snap.round_cost is not None and snap.round_cost.draft_s(1, 4) == pytest.approx(0.012, rel=1e-3)
    forgotten = stores[0].snapshot(now + 80)  # past the cost window
    assert forgotten.round_cost is None and forgotten.alpha is None
    cost_keys = stores[0].client.keys(f"{stores[0].prefix}:cost:*")
    assert cost_keys and all(0 < stores[0].client.ttl(k) <= 73 for k in cost_keys)
    for s in stores:
        s.close()


def test_keys_are_namespaced_per_deployment_and_carry_ttls(redis_server, store):
    store.push("a", delta(arrivals=1), time.time(), 0, 0)
    other = RedisLoadStore(redis_server.url, deployment="someone-else")
    assert other.snapshot(time.time()).qps == 0.0
    keys = store.client.keys(f"{store.prefix}:*")
    assert keys and all(store.client.ttl(k) > 0 for k in keys)


def test_the_switch_is_compare_and_set(store):
    assert store.switch_state() == SwitchState()
    off = SwitchState(False, 123.5)
    assert store.compare_and_set_switch(SwitchState(), off)
    assert not store.compare_and_set_switch(SwitchState(), SwitchState(True, 200.0))  # lost the race
    assert store.switch_state() == off


def policy(override=True):
    thresholds = LoadThresholds(disable_qps=3, enable_qps=1, disable_in_flight=100, enable_in_flight=50, min_dwell_s=0)
    return SpeculationPolicy(PolicySettings(
        gamma_max=4, fallback_gamma=1, stale_after_s=30, min_gain=0, min_dwell_s=0, explore_interval_s=0,
        thresholds=thresholds if override else None))


def decide(monitor, rows=1):
    return monitor.plan([RowState("auto", None, 8, seq_id=f"s{i}") for i in range(rows)], default_gamma=4)


def test_two_monitors_see_one_shared_decision(redis_server, request):
    stores = [RedisLoadStore(redis_server.url, deployment=request.node.name) for _ in range(2)]
    a, b = (LoadMonitor(s, policy(), name) for s, name in zip(stores, "ab"))
    a.on_arrival(50)
    a.tick()
    b.tick()
    assert decide(a).enabled is False and decide(b).enabled is False
    assert stores[1].switch_state().enabled is False


def test_two_replicas_share_one_cost_model_and_reach_the_same_plan(redis_server, request):
    """Each replica measures part of the load; both fit the same round cost from the sum
    in Redis, and plan the same γ for the same batch."""
    stores = [RedisLoadStore(redis_server.url, deployment=request.node.name) for _ in range(2)]
    a, b = (LoadMonitor(s, policy(override=False), name) for s, name in zip(stores, "ab"))
    for monitor, batches in ((a, (1, 2, 1, 2, 1, 2)), (b, (4, 8, 4, 8, 4, 8))):
        for rows in batches:
            for gamma in (0, 2, 4):
                verify, draft = 0.010 + 0.003 * rows * (gamma + 1), 0.001 + 0.003 * gamma
                accepted = [min(gamma, (0, 1, 2, 2)[i % 4]) for i in range(rows)]
                monitor.record(RoundSample.from_rows([gamma] * rows, [gamma] * rows, accepted, draft, verify))
    a.tick()
    b.tick()
    a.tick()
    cost_a, cost_b = a.snapshot.round_cost, b.snapshot.round_cost
    assert cost_a.verify == pytest.approx(cost_b.verify) and cost_a.verify[1] == pytest.approx(0.003, rel=1e-3)
    assert cost_a.draft == pytest.approx(cost_b.draft)
    for rows in (1, 8):
        assert decide(a, rows).gammas == decide(b, rows).gammas
    crossover = a.status().crossover.rows  # speculation pays only at small batches, the same for both
    assert crossover == b.status().crossover.rows and 1 < crossover <= 8


def test_redis_killed_and_restarted_the_monitor_reconnects():
    server = RedisServer().start()
    store = RedisLoadStore(server.url, deployment="restart")
    monitor = LoadMonitor(store, policy(), "r")
    monitor.tick()
    assert monitor.source == "shared"
    server.stop()
    for _ in range(4):
        monitor.record(RoundSample(1, 4, 4, 4, 0.001, 0.01, (1, 1, 1, 1), (1, 1, 1, 1)))
        monitor.tick()
    assert monitor.source == "local" and decide(monitor).gamma > 0
    restarted = RedisServer(port=server.port).start()
    try:
        deadline = time.time() + 10
        while monitor.source != "shared" and time.time() < deadline:
            time.sleep(0.2)
            monitor.tick()
        assert monitor.source == "shared"
        assert store.snapshot(time.time()).alpha == 1.0
    finally:
        restarted.stop()


def arrivals_in_redis(store, now):
    return round(store.snapshot(now).qps * store.window_s)


def test_a_hung_redis_that_resumes_counts_every_arrival_exactly_once():
    """SIGSTOP the redis-server while the monitor pushes (every call times out; Redis keeps
    the commands in its socket buffer and runs them on SIGCONT), then SIGCONT: the monitor
    retries its unacknowledged batches with their ids, and Redis counts each batch once."""
    import os
    import signal

    server = RedisServer().start()
    store = RedisLoadStore(server.url, deployment="hang", window_s=30.0, timeout_s=0.05)
    monitor = LoadMonitor(store, policy(override=False), "r", window_s=30.0)
    sent = 0
    try:
        for _ in range(3):
            monitor.on_arrival(10)
            sent += 10
            monitor.tick()
        assert monitor.source == "shared" and arrivals_in_redis(store, time.time()) == sent
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            for _ in range(8):  # the breaker opens after 3 failures, probes again after 1 s
                monitor.on_arrival(10)
                sent += 10
                monitor.tick()
                time.sleep(0.15)
            assert monitor.source == "local"
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        deadline = time.time() + 10
        while (monitor.source != "shared" or monitor._unsent) and time.time() < deadline:
            time.sleep(0.2)
            monitor.tick()
        assert monitor.source == "shared" and not monitor._unsent
        time.sleep(0.2)  # anything Redis still had buffered has run by now
        assert arrivals_in_redis(store, time.time()) == sent, "no batch counted twice, none lost"
        assert monitor.snapshot.qps == pytest.approx(sent / 30.0)
    finally:
        store.close()
        server.stop()
