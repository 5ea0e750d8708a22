"""The workers' Prometheus metrics: tags, calls, compute, cache and lease gauges, and the poller."""

import asyncio
import re
from pathlib import Path

import pytest

import specdec_metrics.router_metrics as router_metrics
import specdec_metrics.worker_metrics as worker_metrics
from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from fake_metrics import Fake

FAKES = (Fake, Fake, Fake)


def made(metrics) -> list[Fake]:
    return [m for m in vars(metrics).values() if isinstance(m, Fake)]


def test_every_metric_carries_model_role_and_on_the_target_rank():
    draft = WorkerMetrics(FAKES, model="bundled:target", role="draft")
    target = WorkerMetrics(FAKES, model="bundled:target", role="target", rank=0)
    assert len(made(draft)) == len(made(target)) == 8
    assert all(m.default_tags == {"model": "bundled:target", "role": "draft"} for m in made(draft))
    assert all(m.default_tags == {"model": "bundled:target", "role": "target", "rank": "0"} for m in made(target))
    assert draft.tokens.name == "specdec_worker_draft_tokens"
    assert target.tokens.name == "specdec_worker_verified_tokens"
    assert draft.calls.tag_keys == ("model", "role", "rpc", "code")


@pytest.mark.parametrize("role, rank", [("router", None), ("draft", 0), ("target", None)])
def test_a_wrong_role_or_rank_is_refused(role, rank):
    with pytest.raises(ValueError):
        WorkerMetrics(FAKES, role=role, rank=rank)


def test_calls_are_counted_by_rpc_and_code_and_compute_feeds_time_and_tokens():
    metrics = WorkerMetrics(FAKES, role="target", rank=0)
    metrics.observe_call("Verify")
    metrics.observe_call("Verify")
    metrics.observe_call("Verify", "RESOURCE_EXHAUSTED")
    metrics.observe_call("KeepAlive")
    assert metrics.calls.by_tag == {(("code", "OK"), ("rpc", "Verify")): 2,
                                    (("code", "RESOURCE_EXHAUSTED"), ("rpc", "Verify")): 1,
                                    (("code", "OK"), ("rpc", "KeepAlive")): 1}
    metrics.observe_compute("Verify", 0.02, 7)
    metrics.observe_compute("Verify", 0.01, 0)  # plain decoding: nothing drafted to verify
    assert metrics.compute_time.observed == [(0.02, (("rpc", "Verify"),)), (0.01, (("rpc", "Verify"),))]
    assert metrics.tokens.value == 7


def test_gauges_show_the_cache_and_leases_and_expired_sequences_count_only_the_increase():
    metrics = WorkerMetrics(FAKES, role="draft")
    metrics.update(WorkerState(slots=8, free_slots=5, leases=2, sequences=3, expired_sequences=0))
    values = (metrics.slots.value, metrics.slots_used.value, metrics.leases.value, metrics.sequences.value)
    assert values == (8, 3, 2, 3)
    metrics.update(WorkerState(slots=8, free_slots=7, leases=1, sequences=1, expired_sequences=2))
    metrics.update(WorkerState(slots=8, free_slots=7, leases=1, sequences=1, expired_sequences=2))
    metrics.update(WorkerState(slots=8, free_slots=8, leases=0, sequences=0, expired_sequences=3))
    assert metrics.expired.value == 3
    assert (metrics.slots_used.value, metrics.leases.value, metrics.sequences.value) == (0, 0, 0)


def test_the_poller_updates_the_gauges_until_cancelled_and_outlives_a_failed_read():
    metrics = WorkerMetrics(FAKES, role="draft")
    reads = []

    def state():
        reads.append(len(reads))
        if len(reads) == 2:
            raise RuntimeError("a read failed")
        return WorkerState(slots=4, free_slots=4 - len(reads), leases=1, sequences=len(reads), expired_sequences=0)

    async def scenario():
        task = metrics.poll(state, period_s=0.01)
        while len(reads) < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        count = len(reads)
        await asyncio.sleep(0.05)
        return count

    assert asyncio.run(scenario()) == len(reads)  # nothing read after the cancel
    assert metrics.sequences.value == len(reads) and metrics.slots_used.value == len(reads)


def test_metrics_that_are_off_record_nothing_and_need_no_ray():
    metrics = WorkerMetrics.off("target", rank=0)
    metrics.observe_call("Verify", "INTERNAL")
    metrics.observe_compute("Verify", 0.1, 3)
    metrics.update(WorkerState(1, 0, 1, 1, 1))
    assert not made(metrics)


@pytest.mark.parametrize("module", [router_metrics, worker_metrics], ids=["router", "worker"])
def test_every_metric_made_is_listed_in_the_module_docstring(module):
    """The docstring is the list operators read (README points at it): it names every metric."""
    made_names = set(re.findall(r'(?:counter|gauge|histogram)\(\s*f?"([a-z_{}]+)"', Path(module.__file__).read_text()))
    made_names = {n.replace("{p}", "specdec_spec_decode_") for n in made_names}
    assert len(made_names) >= 8
    doc = module.__doc__
    listed = set(re.findall(r"\b(specdec_[a-z_]+)", doc))
    # "specdec_num_requests_running / _waiting", "specdec_prompt_tokens / _generation_tokens":
    # the second name replaces an ending of the first
    for first, second in re.findall(r"\b(specdec_[a-z_]+) / _([a-z_]+)", doc):
        parts = first.split("_")
        listed |= {"_".join(parts[:i] + [second]) for i in range(1, len(parts))}
    assert made_names <= listed, sorted(made_names - listed)
