"""How many cache slots the draft and the target workers have free, waiting for them to settle."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


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


@contextlib.contextmanager
def paged_servers(config, num_blocks: int) -> Iterator[dict]:
    """A draft worker (config.cache's pool) and a target worker whose paged cache holds only
    `num_blocks` blocks of config.cache.block_size, each serving on its own thread on 127.0.0.1
    (stopped on exit)."""
    from specdec.models.loader import load_model
    from specdec.models.model_paths import resolve_model_path
    from specdec.models.model_runner import ModelRunner
    from specdec.verifiers.target_verifier import TargetVerifier
    from specdec_rpc.worker.draft_servicer import DraftServicer
    from specdec_rpc.worker.target_servicer import TargetServicer
    from specdec_rpc.worker.worker_server import ServerThread

    cache = config.cache
    target = ModelRunner(load_model(resolve_model_path(config.models.target)), cache.num_slots, cache.max_seq_len,
                         block_size=cache.block_size, num_blocks=num_blocks)
    servers = {"draft": ServerThread(DraftServicer.from_config(config)),
               "target": ServerThread(TargetServicer(TargetVerifier(target), config.models.target, cache.num_slots))}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()
