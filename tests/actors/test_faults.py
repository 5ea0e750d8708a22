"""Fault injection with real Ray: worker processes are SIGKILLed (by PID, from Ray's actor table).

The server runs a TP = 2 target. Draft death while greedy streams run: the streams finish with exactly the
target's greedy output (they go on target-only while the draft is down) and their stats say they did not
speculate; GetStats says speculation is unavailable and why; the WorkerHub's DraftKeeper
starts a new draft worker, the router finds it through the hub, rebuilds its sequences
from the router's histories, and speculation resumes by itself. Health stays SERVING
throughout (degraded, not down). A target rank killed mid-stream: the hub re-forms the
group, the rounds wait for it and re-prefill from the router's histories, and the streams
finish with the same output. A rank that hangs without dying (SIGSTOP) misses the keeper's
heartbeat for serving.target_hang_s: it is taken for dead, its process killed with the group,
and the streams finish with the same output. A draft that hangs (SIGSTOP) costs a round at
most the draft deadline: no stream pauses for long, and speculation resumes after SIGCONT. A dead leader while
idle: health turns NOT_SERVING within a
keep-alive period, SERVING again once the group is re-formed. A router whose backend failed
to load fails Serve's replica health check.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray

from actors.app import free_port, start_app
from ray_processes import actor_pids
from specdec.config.config import load_config
from specdec_rpc.public.client import SpecdecClient

MAX_NEW = 40
RECOVERY_LIMIT_S = 60.0
HANG_S = 4.0  # serving.target_hang_s: far above a forward of these tiny models, even on 2 busy cores
DRAFT_HANG_S = 4.0  # how long the draft worker is stopped
GAP_LIMIT_S = 2.0  # no stream waits longer for a token while the draft is stopped (worker_timeout_s is 10)


@pytest.fixture(scope="module")
def app():
    config = load_config(overrides={
        "cache": {"num_slots": 8, "max_seq_len": 256},
        "serving": {"port": free_port(), "max_concurrent_requests": 8, "worker_timeout_s": 10.0, "lease_ttl_s": 2.0,
                    "tensor_parallel_size": 2, "distributed_backend": "gloo", "target_hang_s": HANG_S},
    })
    app = start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
    yield app
    app.shutdown()


def drafting(client: SpecdecClient, prompt: list[int]) -> bool:
    """One short request that speculates: did it draft tokens?"""
    response = client.generate(prompt_token_ids=prompt, max_new_tokens=8, mode="on")
    return response.stats.drafted > 0


def test_a_killed_draft_costs_no_request_is_reported_and_comes_back(app, prompt_ids, hf_greedy):
    prompts = prompt_ids[:4]
    with SpecdecClient(app.address, timeout_s=120.0, retries=0) as client:
        assert drafting(client, prompts[0])
        [pid] = actor_pids("DraftWorkerActor")
        streams = [client.generate_stream(prompt_token_ids=p, max_new_tokens=MAX_NEW, mode="on") for p in prompts]
        heads = [list(next(s).token_ids) for s in streams]  # admitted and generating
        outputs: list[list[int]] = [[] for _ in prompts]
        finals: list = [None for _ in prompts]

        def drain(i: int) -> None:
            chunks = list(streams[i])
            outputs[i] = heads[i] + [t for chunk in chunks for t in chunk.token_ids]
            finals[i] = chunks[-1].stats

        threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(prompts))]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        for thread in threads:
            thread.start()
        reasons = []
        while time.monotonic() - killed < 5.0 and not any("unavailable" in r for r in reasons):
            stats = client.stats()
            reasons.append(stats.reason if not stats.speculation_enabled else "")
            time.sleep(0.05)
        for thread in threads:
            thread.join(timeout=120)
        assert outputs == [hf_greedy(p, MAX_NEW) for p in prompts], "target-only rounds are lossless"
        assert any(r.startswith("speculation unavailable: draft worker") for r in reasons), reasons
        assert any(not stats.speculation_enabled for stats in finals), "requests that ended without the draft say so"
        assert client.health() == "SERVING"  # degraded, not down
        while not drafting(client, prompts[1]):
            assert time.monotonic() - killed < RECOVERY_LIMIT_S, "speculation did not come back"
            time.sleep(0.5)
        recovered_s = time.monotonic() - killed
        stats = client.stats()
        assert stats.speculation_enabled and "unavailable" not in stats.reason
        print(f"\ndraft killed -> a request drafts again: {recovered_s:.1f}s")
    status = ray.get(app.hub.draft_status.remote())
    assert status["restarts"] == 1 and status["down_reason"] is None
    print(f"draft killed -> new draft worker serving: {status['last_recovery_s']:.1f}s")
    assert actor_pids("DraftWorkerActor") not in ([], [pid])


def timed_stream(stream, head: list[int], times: list[float], outputs: list[int]) -> None:
    """Drain a stream: its tokens into `outputs`, the arrival time of each chunk into `times`."""
    outputs.extend(head)
    for chunk in stream:
        times.append(time.monotonic())
        outputs.extend(chunk.token_ids)


@pytest.mark.slow
def test_a_hung_draft_stalls_no_stream_and_speculation_resumes_after_it(app, prompt_ids, hf_greedy):
    """SIGSTOP the draft worker's process under concurrent greedy streams (speculation ON
    and OFF): a round waits for drafts at most the draft deadline, later rounds skip the
    stopped worker, so no stream pauses for long; every output is the target's greedy
    output; after SIGCONT a request drafts again within seconds."""
    prompts, modes, max_new = prompt_ids[:4], ["on", "on", "on", "off"], 150
    with SpecdecClient(app.address, timeout_s=120.0, retries=0) as client:
        while not drafting(client, prompts[0]):  # the draft serves (a previous test may have restarted it)
            time.sleep(0.5)
        [pid] = actor_pids("DraftWorkerActor")
        streams = [client.generate_stream(prompt_token_ids=p, max_new_tokens=max_new, mode=m)
                   for p, m in zip(prompts, modes)]
        heads = [list(next(s).token_ids) for s in streams]
        times: list[list[float]] = [[] for _ in prompts]
        outputs: list[list[int]] = [[] for _ in prompts]
        threads = [threading.Thread(target=timed_stream, args=(s, h, t, o))
                   for s, h, t, o in zip(streams, heads, times, outputs)]
        for thread in threads:
            thread.start()
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            time.sleep(DRAFT_HANG_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        while not drafting(client, prompts[1]):
            assert time.monotonic() - resumed < 10.0, "speculation did not resume within 10 s of SIGCONT"
            time.sleep(0.2)
        drafting_again_s = time.monotonic() - resumed
        for thread in threads:
            thread.join(timeout=120)
        assert outputs == [hf_greedy(p, max_new) for p in prompts], "rounds without drafts are lossless"
        gaps = [max((b - a for a, b in zip(t, t[1:]) if b > stopped and a < resumed), default=0.0) for t in times]
        assert any(t and t[-1] > stopped + 1.0 for t in times), "the streams ran during the fault"
        assert max(gaps) < GAP_LIMIT_S, f"longest token gap per stream during the fault: {gaps}"
        print(f"\ndraft stopped {DRAFT_HANG_S:.0f}s: longest token gaps {['%.2f' % g for g in gaps]} s; "
              f"drafting again {drafting_again_s:.1f}s after SIGCONT")
    assert actor_pids("DraftWorkerActor") == [pid], "a stopped draft is not restarted: it is waited for"


def test_a_router_whose_backend_failed_to_load_fails_serves_health_check(app):
    from actors.router import SpecdecRouter

    def factory():
        raise FileNotFoundError("no checkpoint at /models/missing")

    router = SpecdecRouter.func_or_class(factory)
    router._loader.join(timeout=10)
    with pytest.raises(RuntimeError, match="failed to load: FileNotFoundError: no checkpoint at /models/missing"):
        router.check_health()


def stream_all(client: SpecdecClient, prompts: list[list[int]], max_new: int, fault) -> list[list[int]]:
    """Start one greedy stream per prompt, call fault() once each produced tokens, drain them concurrently."""
    streams = [client.generate_stream(prompt_token_ids=p, max_new_tokens=max_new, mode="on") for p in prompts]
    heads = [list(next(s).token_ids) for s in streams]
    outputs: list[list[int]] = [[] for _ in prompts]

    def drain(i: int) -> None:
        outputs[i] = heads[i] + [t for chunk in streams[i] for t in chunk.token_ids]

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(prompts))]
    fault()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return outputs


def test_a_killed_target_rank_pauses_the_streams_which_finish_with_the_same_output(app, prompt_ids, hf_greedy):
    """SIGKILL rank 1 of the TP = 2 group mid-stream: the hub re-forms the group, the
    router's rounds wait for it and re-prefill every sequence from its history."""
    prompts = prompt_ids[:4]
    with SpecdecClient(app.address, timeout_s=300.0, retries=0) as client:
        [pid] = actor_pids("TargetFollower")
        killed = []
        outputs = stream_all(client, prompts, MAX_NEW,
                             lambda: (os.kill(pid, signal.SIGKILL), killed.append(time.monotonic())))
        finished_s = time.monotonic() - killed[0]
        assert outputs == [hf_greedy(p, MAX_NEW) for p in prompts], "the same output after the pause"
        assert client.health() == "SERVING"
    status = ray.get(app.hub.target_status.remote())
    assert status["restarts"] == 1 and status["down_reason"] is None
    print(f"\nrank killed -> group re-formed in {status['last_recovery_s']:.1f}s; "
          f"streams done {finished_s:.1f}s after the kill")


def process_state(pid: int) -> str | None:
    """The state letter of a process (T = stopped, Z = zombie), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_hung_target_rank_is_taken_for_dead_and_the_streams_finish_with_the_same_output(app, prompt_ids, hf_greedy):
    """SIGSTOP rank 1 of the TP = 2 group mid-stream: it does not die, the leader blocks in
    its all-reduce; the keeper's heartbeat takes it for hung after target_hang_s, kills the
    group (the stopped process too) and re-forms it; the rounds resend with whole histories."""
    prompts = prompt_ids[:4]
    restarts = ray.get(app.hub.target_status.remote())["restarts"]
    [pid] = actor_pids("TargetFollower")
    stopped = []
    try:
        with SpecdecClient(app.address, timeout_s=300.0, retries=0) as client:
            outputs = stream_all(client, prompts, MAX_NEW,
                                 lambda: (os.kill(pid, signal.SIGSTOP), stopped.append(time.monotonic())))
            finished_s = time.monotonic() - stopped[0]
            assert outputs == [hf_greedy(p, MAX_NEW) for p in prompts], "the same output after the pause"
            assert client.health() == "SERVING"
        status = ray.get(app.hub.target_status.remote())
        assert status["restarts"] == restarts + 1 and status["down_reason"] is None
        deadline = time.monotonic() + 10.0
        while process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process_state(pid) in (None, "Z"), "the re-formed group left the stopped rank's process behind"
        assert pid not in actor_pids("TargetFollower")
    finally:
        if process_state(pid) not in (None, "Z"):  # never leave a stopped process behind
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    print(f"\nrank stopped -> taken for hung and re-formed in {status['last_recovery_s']:.1f}s; "
          f"streams done {finished_s:.1f}s after the SIGSTOP")


def test_a_dead_target_leader_is_not_serving_until_the_group_is_re_formed(app, prompt_ids, hf_greedy):
    """An idle router notices through its keep-alives (NOT_SERVING), then serves again."""
    with SpecdecClient(app.address, timeout_s=300.0, retries=0) as client:
        assert client.health() == "SERVING"
        [pid] = actor_pids("TargetLeader")
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        while client.health() == "SERVING":
            assert time.monotonic() - killed < 10.0, "health still says SERVING"
            time.sleep(0.1)
        down_s = time.monotonic() - killed
        response = client.generate(prompt_token_ids=prompt_ids[0], max_new_tokens=8)  # waits for the new group
        assert list(response.token_ids) == hf_greedy(prompt_ids[0], 8)
        while client.health() != "SERVING":
            assert time.monotonic() - killed < 120.0
            time.sleep(0.2)
        print(f"\nleader killed -> NOT_SERVING {down_s:.1f}s -> SERVING again {time.monotonic() - killed:.1f}s")


def test_a_router_replica_started_after_the_workers_restarted_finds_them(app, prompt_ids, hf_greedy):
    """After the restarts above the addresses the app started with are dead: the replica
    Serve starts in place of a killed one asks the hub where the workers serve now."""
    assert ray.get(app.hub.target_status.remote())["restarts"] >= 1
    [pid] = actor_pids(":SpecdecRouter")
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with SpecdecClient(app.address, timeout_s=120.0, retries=7, backoff_s=0.5) as client:
        response = client.generate(prompt_token_ids=prompt_ids[1], max_new_tokens=8, mode="on")
        assert list(response.token_ids) == hf_greedy(prompt_ids[1], 8)
        assert response.stats.drafted > 0, "the new replica drafts with the restarted draft worker"
    print(f"\nrouter killed -> served again by its replacement: {time.monotonic() - killed:.1f}s")
