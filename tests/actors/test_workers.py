"""The Ray workers (real Ray, CPU): a draft worker actor and the tensor-parallel target group serve, over
gRPC, exactly the greedy output of the target alone; the group's shutdown frees its placement group."""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group_table

from actors.draft_worker import start_draft_worker
from actors.target_group import TargetGroup
from specdec.config.config import load_config
from specdec.round.engine import SpeculativeEngine
from specdec.requests.request import GenerationRequest
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier

MAX_NEW = 24
NUM_CPUS = 4


def config(tensor_parallel_size: int = 1):
    return load_config(
        overrides={
            "cache": {"num_slots": 4, "max_seq_len": 256},
            "serving": {"tensor_parallel_size": tensor_parallel_size, "distributed_backend": "gloo"},
        }
    )


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray for the module (reused if the session already started one)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def draft_address(ray_cluster):
    actor, address = start_draft_worker(config(), name="test-draft-worker")
    yield address
    ray.kill(actor)


def wait_for_cpus(expected: float, timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while (available := ray.available_resources().get("CPU", 0.0)) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return available


def test_the_draft_worker_serves_the_draft_with_the_targets_vocabulary(draft_address):
    proposer = RemoteProposer(draft_address)
    try:
        info = proposer.info()
        assert (info.model, info.vocab_size, info.num_slots, info.free_slots) == ("bundled:draft", 4096, 4, 4)
    finally:
        proposer.close()


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_the_target_group_serves_the_greedy_output_of_the_target_alone(
    draft_address, prompt_ids, hf_greedy, tokenizer, tensor_parallel_size
):
    group = TargetGroup(config(tensor_parallel_size), name_prefix=f"test-target-tp{tensor_parallel_size}")
    address = group.start()
    pg = group.placement_group
    try:
        verifier, proposer = RemoteVerifier(address), RemoteProposer(draft_address)
        engine = SpeculativeEngine(verifier, proposer, gamma=4, eos_token_ids=[tokenizer.eos_token_id])
        results = engine.generate([GenerationRequest(p, MAX_NEW) for p in prompt_ids[:3]])
        assert [r.token_ids for r in results] == [hf_greedy(p, MAX_NEW) for p in prompt_ids[:3]]
        assert engine.stats.accepted > 0
        assert verifier.info().free_slots == 4, "finished sequences released their target slots"
        info = group.info()
        assert info["tensor_parallel_size"] == tensor_parallel_size
        assert (info["max_batch_size"], info["free_slots"]) == (3, 4), "one batched call per round; all released"
        verifier.close()
        proposer.close()
    finally:
        group.shutdown()
    assert placement_group_table(pg)["state"] == "REMOVED"
    assert wait_for_cpus(NUM_CPUS - 1) == NUM_CPUS - 1, "only the draft worker still holds a CPU"


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_fails_before_starting_anything(ray_cluster):
    group = TargetGroup(config(tensor_parallel_size=3))
    with pytest.raises(ValueError, match="num_attention_heads=8 is not divisible by tensor-parallel world_size=3"):
        group.start()
    assert group.placement_group is None and group.leader is None
