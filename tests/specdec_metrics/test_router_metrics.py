"""The router's Prometheus metrics follow the engine's totals and the load monitor's decision."""

from types import SimpleNamespace

from specdec_metrics.router_metrics import RouterMetrics
from specdec.policy.policy_status import PolicyStatus
from specdec.policy.speculation_policy import Crossover
from specdec.requests.stats import SpecStats
from fake_metrics import Fake


def engine_with(rounds):
    stats = SpecStats()
    for drafted, accepted in rounds:
        stats.record_round(drafted, accepted, gamma=4)
    return SimpleNamespace(stats=stats, num_running=3, num_waiting=1, gamma=4)


def test_counters_add_only_the_increase_since_the_last_poll():
    metrics = RouterMetrics((Fake, Fake, Fake))
    metrics.update(engine_with([(4, 2), (4, 4)]), None)
    metrics.update(engine_with([(4, 2), (4, 4), (0, 0), (4, 1)]), None)
    assert metrics.num_drafts.value == 3  # rounds that drafted
    assert metrics.draft_tokens.value == 12 and metrics.accepted_tokens.value == 7
    assert metrics.accepted_per_pos.by_tag[(("position", "0"),)] == 3
    assert metrics.accepted_per_pos.by_tag[(("position", "3"),)] == 1
    assert (metrics.running.value, metrics.waiting.value) == (3, 1)


def test_preemptions_count_the_increase_of_the_engines_total():
    metrics, engine = RouterMetrics((Fake, Fake, Fake)), engine_with([])
    metrics.update(engine, None)
    assert metrics.preemptions.value == 0, "an engine without preemptions counts none"
    for total in (2, 5):
        engine.preemptions = total
        metrics.update(engine, None)
    assert metrics.preemptions.value == 5


def test_gauges_show_the_load_monitors_decision():
    metrics = RouterMetrics((Fake, Fake, Fake))
    status = PolicyStatus(gamma=0, speculation_enabled=False, alpha=0.61, qps=12.5, off_because_of_load=True,
                          crossover=Crossover(rows=6, qps=3.0))
    metrics.update(engine_with([]), status)
    values = (metrics.gamma.value, metrics.enabled.value, metrics.acceptance.value, metrics.qps.value)
    assert values == (0, 0.0, 0.61, 12.5)
    assert (metrics.off_for_load.value, metrics.crossover.value) == (1.0, 6.0)


def test_without_a_load_monitor_the_gauges_show_the_static_gamma():
    metrics = RouterMetrics((Fake, Fake, Fake))
    metrics.update(engine_with([]), None)
    assert (metrics.gamma.value, metrics.enabled.value, metrics.off_for_load.value) == (4, 1.0, 0.0)


def test_a_proposer_that_cannot_draft_shows_as_unavailable_and_not_enabled():
    metrics = RouterMetrics((Fake, Fake, Fake))
    engine = engine_with([])
    engine.proposer = SimpleNamespace(unavailable_reason="draft worker 10.0.0.5:1 is down")
    metrics.update(engine, {"gamma": 4, "speculation_enabled": True})
    assert (metrics.enabled.value, metrics.unavailable.value) == (0.0, 1.0)
    engine.proposer.unavailable_reason = None
    metrics.update(engine, {"gamma": 4, "speculation_enabled": True})
    assert (metrics.enabled.value, metrics.unavailable.value) == (1.0, 0.0)


def test_streams_feed_the_latency_histograms():
    metrics = RouterMetrics((Fake, Fake, Fake))
    metrics.observe_stream(0.2, [(0.03, 3), (0.01, 1)])
    assert metrics.ttft.observed == [0.2]
    assert metrics.itl.observed == [0.01, 0.01, 0.01, 0.01]


def test_every_metric_carries_the_model_tag():
    metrics = RouterMetrics((Fake, Fake, Fake), model="bundled:target")
    made = [m for m in vars(metrics).values() if isinstance(m, Fake)]
    assert len(made) >= 20 and all(m.default_tags == {"model": "bundled:target"} for m in made)


def test_drafted_tokens_per_position_let_per_position_acceptance_survive_a_change_of_gamma():
    metrics = RouterMetrics((Fake, Fake, Fake))
    metrics.update(engine_with([(4, 2), (2, 2)]), None)  # γ 4, then γ 2
    drafted = {k[0][1]: v for k, v in metrics.drafted_per_pos.by_tag.items()}
    accepted = {k[0][1]: v for k, v in metrics.accepted_per_pos.by_tag.items()}
    assert drafted == {"0": 2, "1": 2, "2": 1, "3": 1}
    assert accepted == {"0": 2, "1": 2}


def test_round_timings_and_cache_use_come_from_the_engine():
    from specdec.round.round_profile import RoundProfile

    engine = engine_with([])
    engine.profile = RoundProfile()
    engine.profile.record((0.004, None), (0.010, None), 0.015)
    engine.profile.record((0.0, None), (0.008, None), 0.009)  # a round that drafted nothing
    engine.verifier = SimpleNamespace(num_slots=8, num_free_slots=6)
    metrics = RouterMetrics((Fake, Fake, Fake))
    metrics.update(engine, None)
    assert metrics.draft_time.observed == [0.004] and metrics.verify_time.observed == [0.010, 0.008]
    assert metrics.cache_usage.value == 0.25
    metrics.update(engine, None)  # each round is observed once
    assert len(metrics.verify_time.observed) == 2


def test_finished_requests_feed_latency_queue_tokens_and_finish_reasons():
    from specdec.serving.request_log import FinishedRequest, RequestLog

    log = RequestLog(limit=3)
    for i in range(4):  # the oldest is dropped: nobody drained
        log.add(FinishedRequest(10 + i, 5, "length" if i % 2 else "stop", 0.5 + i, 0.1, streaming=bool(i % 2),
                                cached_tokens=16 * i))
    metrics = RouterMetrics((Fake, Fake, Fake))
    metrics.observe_finished(log.drain())
    assert log.drain() == []
    assert metrics.prompt_tokens.value == 11 + 12 + 13 and metrics.generation_tokens.value == 15
    assert metrics.cached_prompt_tokens.value == 16 + 32 + 48
    assert {k[0][1]: v for k, v in metrics.finished.by_tag.items()} == {"length": 2, "stop": 1}
    assert sorted(metrics.latency.observed) == [(1.5, (("streaming", "true"),)), (2.5, (("streaming", "false"),)),
                                                (3.5, (("streaming", "true"),))]
    assert metrics.queue_time.observed == [0.1, 0.1, 0.1]
