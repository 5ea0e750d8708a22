"""MirroredRunner replays the leader's cache operations on the follower ranks: they travel,
in order, with the next forward as one call per follower, a sequence's reserve with its
allocation, so every rank's paged cache admits alike and the ranks stay in lockstep."""

from __future__ import annotations

import pytest
import torch

from actors import mirrored_runner
from actors.mirrored_runner import MirroredRunner
from actors.target_shard import TargetFollower
from specdec.models.loader import load_model
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """The stand-in followers' 'object refs' are their calls (None when recorded): ray.get runs them."""
    monkeypatch.setattr(mirrored_runner.ray, "get", lambda refs: [ref() if callable(ref) else ref for ref in refs])


def small_runner(num_slots: int = 2, num_blocks: int = 4) -> ModelRunner:
    return ModelRunner(load_model(resolve_model_path("bundled:target")), num_slots, 64, block_size=16,
                       num_blocks=num_blocks)


class RecordingFollower:
    """Stands in for a follower actor: records each `method.remote(*args)` submitted to it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, method: str):
        recorder = self

        class _Method:
            @staticmethod
            def remote(*args):
                recorder.calls.append((method, args))

        return _Method


def test_an_allocation_sends_its_reserve_to_every_follower():
    followers = [RecordingFollower(), RecordingFollower()]
    mirrored = MirroredRunner(small_runner(), followers)
    slot = mirrored.allocate_slot(16)
    assert [f.calls for f in followers] == [[]] * 2, "queued for the next forward"
    mirrored.sync()
    assert [f.calls for f in followers] == [[("step", ([("allocate_slot", (slot, 16))], None))]] * 2
    assert mirrored.block_capacity == (4, 16) and mirrored.admits([48, 16]) == 1, "3 of 4 blocks left"
    assert mirrored.cached_tokens(slot) == 0


def test_a_growth_sends_the_reserves_the_leader_raised_to_every_follower():
    followers = [RecordingFollower(), RecordingFollower()]
    mirrored = MirroredRunner(small_runner(), followers)
    first, second = mirrored.allocate_slot(16), mirrored.allocate_slot(16)
    assert mirrored.grow_reserves([(first, 32), (second, 48)]) == 1, "4 blocks: the second cannot grow to 3"
    assert mirrored.grow_reserves([(second, 48)]) == 0, "nothing raised: not sent"
    mirrored.sync()
    ops = [("allocate_slot", (first, 16)), ("allocate_slot", (second, 16)), ("grow_reserves", ([(first, 32)], 1))]
    assert [f.calls for f in followers] == [[("step", (ops, None))]] * 2


def test_the_cache_operations_travel_with_the_next_forward_as_one_call_per_follower():
    followers = [RecordingFollower(), RecordingFollower(), RecordingFollower()]
    mirrored = MirroredRunner(small_runner(), followers)
    slot = mirrored.allocate_slot()
    mirrored.forward([slot], [[1, 2, 3, 4]])
    mirrored.truncate(slot, 2)
    mirrored.forward([slot], [[5, 6]], last_only=True)
    mirrored.free_slot(slot)
    assert [f.calls for f in followers] == [[
        ("step", ([("allocate_slot", (slot, None))], ([slot], [[1, 2, 3, 4]], False))),
        ("step", ([("truncate", (slot, 2))], ([slot], [[5, 6]], True))),
    ]] * 3, "the free waits for the next forward"


class LocalFollower:
    """A follower rank in this process: `method.remote(*args)` returns the call of TargetFollower's
    method, which ray.get runs (in submission order, as Ray runs a threaded actor's calls)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.rank = TargetFollower.__ray_actor_class__()
        self.rank.runner = runner

    def __getattr__(self, method: str):
        bound = getattr(self.rank, method)
        return type("_Method", (), {"remote": staticmethod(lambda *args: lambda: bound(*args))})


def test_a_follower_replaying_the_steps_holds_the_leaders_cache_and_logits():
    leader, follower = small_runner(num_slots=3, num_blocks=8), small_runner(num_slots=3, num_blocks=8)
    mirrored = MirroredRunner(leader, [LocalFollower(follower)])
    first, second = mirrored.allocate_slot(16), mirrored.allocate_slot(16)
    mirrored.forward([first, second], [[1, 2, 3, 4, 5], [6, 7]])
    mirrored.truncate(first, 3)
    mirrored.free_slot(second)
    third = mirrored.allocate_slot(32)
    assert mirrored.grow_reserves([(first, 48)]) == 1
    mirrored.forward([first, third], [[8, 9], [10, 11, 12]], last_only=True)
    assert [follower.slot_length(s) for s in (first, third)] == [leader.slot_length(s) for s in (first, third)]
    assert follower.num_free_slots == leader.num_free_slots and follower.cache_usage == leader.cache_usage
    again = small_runner(num_slots=3, num_blocks=8)
    a, b = again.allocate_slot(), again.allocate_slot()
    again.forward([a], [[1, 2, 3, 8, 9]]), again.forward([b], [[10, 11, 12]])
    assert torch.allclose(follower.forward([first, third], [[13], [14]], last_only=True),
                          again.forward([a, b], [[13], [14]], last_only=True), atol=1e-5), "the same caches"


def test_a_follower_that_hands_out_another_slot_fails_the_leaders_next_forward():
    leader, follower = small_runner(), small_runner()
    follower.allocate_slot(16)  # the follower's cache has diverged: its next slot is another one
    mirrored = MirroredRunner(leader, [LocalFollower(follower)])
    slot = mirrored.allocate_slot(16)
    with pytest.raises(RuntimeError, match="the ranks diverged"):
        mirrored.forward([slot], [[1, 2]])
