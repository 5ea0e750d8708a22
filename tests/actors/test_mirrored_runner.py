"""MirroredRunner replays the leader's cache operations on the follower ranks: a sequence's
reserve travels with its allocation, so every rank's paged cache admits alike."""

from __future__ import annotations

from actors.mirrored_runner import MirroredRunner
from specdec.models.loader import load_model
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner


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
    runner = ModelRunner(load_model(resolve_model_path("bundled:target")), 2, 64, block_size=16, num_blocks=4)
    followers = [RecordingFollower(), RecordingFollower()]
    mirrored = MirroredRunner(runner, followers)
    slot = mirrored.allocate_slot(16)
    assert [f.calls for f in followers] == [[("allocate_slot", (slot, 16))]] * 2
    assert mirrored.block_capacity == (4, 16) and mirrored.admits([48, 16]) == 1, "3 of 4 blocks left"
    assert mirrored.cached_tokens(slot) == 0


def test_a_growth_sends_the_reserves_the_leader_raised_to_every_follower():
    runner = ModelRunner(load_model(resolve_model_path("bundled:target")), 2, 64, block_size=16, num_blocks=4)
    followers = [RecordingFollower(), RecordingFollower()]
    mirrored = MirroredRunner(runner, followers)
    first, second = mirrored.allocate_slot(16), mirrored.allocate_slot(16)
    assert mirrored.grow_reserves([(first, 32), (second, 48)]) == 1, "4 blocks: the second cannot grow to 3"
    assert [f.calls[-1] for f in followers] == [("grow_reserves", ([(first, 32)], 1))] * 2
    calls = len(followers[0].calls)
    assert mirrored.grow_reserves([(second, 48)]) == 0 and len(followers[0].calls) == calls, "nothing raised: not sent"
