"""With real Ray: the draft worker actor exports its own metrics through Ray's metrics agent
(scraped from the node's Prometheus endpoint, as Prometheus does) after a Propose call."""

from __future__ import annotations

import re
import time
import urllib.request

import grpc
import pytest

ray = pytest.importorskip("ray")

from actors.draft_worker import start_draft_worker  # noqa: E402
from specdec.wiring.ports import free_port  # noqa: E402
from specdec.config.config import load_config  # noqa: E402
from specdec.sampling.sampling_params import SamplingParams  # noqa: E402
from specdec_rpc.worker.history_sync import sampling_to_proto  # noqa: E402
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402

NUM_SLOTS = 2


@pytest.fixture(scope="module")
def metrics_port():
    if ray.is_initialized():
        pytest.skip("Ray already runs in this process without a known metrics export port")
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _metrics_export_port=port,
             _system_config={"metrics_report_interval_ms": 500})
    yield port
    ray.shutdown()


def scrape(port: int, name: str, **labels: str) -> float | None:
    """The value of the sample `name` whose labels include `labels` (None: not exported yet)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        match = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if match and match.group(1) == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(match.group(3))
    return None


def wait_for(port: int, expected: float, name: str, timeout_s: float = 30.0, **labels: str) -> None:
    deadline = time.monotonic() + timeout_s
    while (value := scrape(port, name, **labels)) != expected:
        assert time.monotonic() < deadline, f"{name}{labels} = {value}, expected {expected}"
        time.sleep(0.25)


def test_the_draft_worker_exports_its_propose_calls_tokens_and_cache_use(metrics_port):
    config = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": 128}})
    actor, address = start_draft_worker(config)
    try:
        with grpc.insecure_channel(address) as channel:
            reply = worker_pb2_grpc.DraftWorkerStub(channel).Propose(worker_pb2.ProposeRequest(
                sequences=[worker_pb2.HistoryDelta(seq_id="a", token_ids=[1, 2, 3, 4],
                                                   sampling=sampling_to_proto(SamplingParams()))],
                gammas=[2], lease_id="lease-1"))
        assert len(reply.drafts[0].token_ids) == 2
        tags = {"model": config.models.target, "role": "draft"}
        wait_for(metrics_port, 1.0, "ray_specdec_worker_calls_total", rpc="Propose", code="OK", **tags)
        wait_for(metrics_port, 2.0, "ray_specdec_worker_draft_tokens_total", **tags)
        wait_for(metrics_port, 1.0, "ray_specdec_worker_compute_time_seconds_count", rpc="Propose", **tags)
        wait_for(metrics_port, float(NUM_SLOTS), "ray_specdec_worker_kv_cache_slots", **tags)
        wait_for(metrics_port, 1.0, "ray_specdec_worker_kv_cache_slots_used", **tags)
        wait_for(metrics_port, 1.0, "ray_specdec_worker_sequences", **tags)
    finally:
        ray.kill(actor)
