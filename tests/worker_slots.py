"""How many cache slots the draft and the target workers have free, waiting for them to settle."""

from __future__ import annotations

import time


def free_slots_within(workers, num_slots: int, timeout_s: float = 15.0) -> tuple[int, int]:
    """(target, draft) free slots once both are all free, or as they are after timeout_s."""
    verifier, proposer = workers
    deadline = time.monotonic() + timeout_s
    while True:
        free = verifier.info().free_slots, proposer.info().free_slots
        if free == (num_slots, num_slots) or time.monotonic() > deadline:
            return free
        time.sleep(0.2)


def target_servicer(config):
    """A real TargetServicer over the bundled target, with config.cache's slots (no Ray, no server)."""
    from specdec.wiring.engine_builder import load_runner
    from specdec.verifiers.target_verifier import TargetVerifier
    from specdec_rpc.worker.target_servicer import TargetServicer

    runner = load_runner(config.models.target, config.models, config.cache)
    return TargetServicer(TargetVerifier(runner), config.models.target, config.cache.num_slots)
