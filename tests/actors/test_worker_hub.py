"""The WorkerHub supervises the workers of one configuration (real Ray, CPU).

The same configuration shares a hub; another one (a redeploy with another cache, model,
TP size, ...) replaces it and releases the old workers and placement groups; a draft that
fails to load after the target started leaks no placement group; workers no router uses
any more are released after serving.idle_release_s. The target keeper's heartbeat tells a
busy rank from a hung (SIGSTOPped) and a dead one.
"""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group_table

from actors.worker_hub import find_hub, get_or_create_hub, start_hub, stop_hub, worker_key
from specdec.config.config import load_config
from specdec_rpc.worker.remote_verifier import RemoteVerifier


def config(deployment: str, **sections):
    overrides = {"cache": {"num_slots": 4, "max_seq_len": 256}, "load_monitor": {"deployment": deployment}}
    for name, values in sections.items():
        overrides[name] = {**overrides.get(name, {}), **values}
    return load_config(overrides=overrides)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="specdec")
    yield
    if started:
        ray.shutdown()


def live_placement_groups() -> set[str]:
    return {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"}


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    return condition()


def alive(actor) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=5)
        return True
    except Exception:
        return False


def test_the_same_configuration_shares_workers_and_another_replaces_and_releases_them():
    before = live_placement_groups()
    first = config("hub-redeploy")
    hub = get_or_create_hub(first)
    target, draft = start_hub(hub)
    draft_actor = ray.get(hub.draft_actor.remote())
    assert len(live_placement_groups() - before) == 1
    again = get_or_create_hub(config("hub-redeploy"))
    assert again._actor_id == hub._actor_id and start_hub(again) == (target, draft)
    other = config("hub-redeploy", cache={"num_slots": 2})
    assert worker_key(other) != worker_key(first)
    replaced = get_or_create_hub(other)
    try:
        assert replaced._actor_id != hub._actor_id and ray.get(replaced.worker_key.remote()) == worker_key(other)
        assert wait_for(lambda: live_placement_groups() == before), "the old target's placement group is released"
        assert not alive(hub) and not alive(draft_actor)
    finally:
        stop_hub(other)


def test_a_draft_that_fails_to_load_after_the_target_started_leaks_no_placement_group():
    before = live_placement_groups()
    broken = config("hub-broken-draft", models={"draft": "/nonexistent/draft-model"})
    hub = get_or_create_hub(broken)
    try:
        with pytest.raises(Exception, match="nonexistent"):
            start_hub(hub)
        assert wait_for(lambda: live_placement_groups() == before)
        assert ray.get(hub.progress.remote()).startswith("starting the draft worker")
    finally:
        stop_hub(broken)


def test_workers_no_router_holds_a_lease_on_are_released():
    before = live_placement_groups()
    idle = config("hub-idle", serving={"idle_release_s": 2.0, "lease_ttl_s": 1.0}, speculation={"proposer": "ngram"})
    hub = get_or_create_hub(idle)
    target, _ = start_hub(hub)
    router = RemoteVerifier(target, timeout_s=5.0, lease_ttl_s=1.0)  # a router: its lease is renewed
    try:
        router.info()
        time.sleep(4.0)
        assert alive(hub), "a router holds a lease: the workers stay"
    finally:
        router.close()  # stops renewing: the lease lapses after 1 s
    released = time.monotonic()
    assert wait_for(lambda: find_hub(idle) is None, timeout_s=30.0), "the hub released the workers and exited"
    assert wait_for(lambda: live_placement_groups() == before)
    print(f"\nlast lease closed -> workers released: {time.monotonic() - released:.1f}s")


@ray.remote(num_cpus=0)
class Rank:
    """Stands in for a target rank: a threaded actor that is busy for a while, or not."""

    def pid(self) -> int:
        import os

        return os.getpid()

    def work(self, seconds: float) -> None:
        time.sleep(seconds)


def first_problem(heartbeat, group, ranks, within_s: float):
    """Call heartbeat.check as the keeper's watcher does (once a second) until it names a problem."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        problem = heartbeat.check(group, ranks)
        if problem is not None:
            return problem
        time.sleep(1.0)
    return None


def test_the_heartbeat_tells_a_busy_rank_from_a_hung_and_a_dead_one():
    """A rank busy for less than target_hang_s is fine; a SIGSTOPped one is hung after
    target_hang_s; a killed one is dead at once."""
    import os
    import signal

    from actors.target_keeper import RankHeartbeat

    ranks = [Rank.remote() for _ in range(2)]
    pid = ray.get(ranks[1].pid.remote())
    heartbeat = RankHeartbeat(hang_s=5.0)
    group = object()
    assert heartbeat.check(group, ranks) is None
    ranks[1].work.remote(2.0)  # answers its pings late, within hang_s
    assert first_problem(heartbeat, group, ranks, within_s=5.0) is None
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        why, hung = first_problem(heartbeat, group, ranks, within_s=15.0)
        assert hung and why.startswith("target rank 1 hung") and time.monotonic() - stopped >= 5.0, why
    finally:
        os.kill(pid, signal.SIGCONT)
    ray.kill(ranks[1])
    fresh = RankHeartbeat(hang_s=5.0)
    why, hung = first_problem(fresh, object(), ranks, within_s=10.0)
    assert not hung and why.startswith("target rank 1 died"), why
    ray.kill(ranks[0])
