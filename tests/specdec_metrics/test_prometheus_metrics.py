"""The router's metrics in a Prometheus registry of their own (for /metrics on the API port),
made alongside Ray's from the same updates."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from fake_metrics import Fake
from specdec.serving.request_log import FinishedRequest
from specdec.requests.stats import SpecStats
from specdec_metrics.prometheus_metrics import exposition, prometheus_metric_classes, tee_metric_classes
from specdec_metrics.router_metrics import RouterMetrics


def samples(registry) -> dict[tuple[str, tuple], float]:
    text = exposition(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def engine():
    stats = SpecStats()
    stats.record_round(4, 3, gamma=4)
    return SimpleNamespace(stats=stats, num_running=2, num_waiting=0, gamma=4)


def test_updates_reach_both_ray_and_the_registry_with_the_model_tag():
    registry = CollectorRegistry()
    metrics = RouterMetrics(tee_metric_classes((Fake, Fake, Fake), prometheus_metric_classes(registry)), model="m")
    metrics.update(engine(), None)
    metrics.observe_finished([FinishedRequest(5, 7, "length", 0.5, 0.01, True)])
    metrics.observe_stream(0.2, [(0.03, 3)])
    got = samples(registry)
    model = (("model", "m"),)
    assert got[("specdec_spec_decode_num_draft_tokens_total", model)] == 4
    assert got[("specdec_spec_decode_num_accepted_tokens_total", model)] == 3
    assert got[("specdec_num_requests_running", model)] == 2
    assert got[("specdec_requests_finished_total", (("finish_reason", "length"), ("model", "m")))] == 1
    assert got[("specdec_time_to_first_token_seconds_count", model)] == 1
    assert got[("specdec_inter_token_latency_seconds_count", model)] == 3
    assert metrics.draft_tokens._metrics[0].value == 4  # the Ray side got the same update
