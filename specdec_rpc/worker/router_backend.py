"""The distributed router's engine parts: gRPC clients of the workers as the verifier and
the draft proposer, handed to the core's one assembly (`build_served_engine`).
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.config.config import SpecdecConfig
from specdec.wiring.engine_builder import EngineParts
from specdec.policy.speculation_policy import RoundPolicy


def remote_parts(
    config: SpecdecConfig, target_address: str, draft_address: str | None,
    resolve_draft: Callable[[], str | None] | None = None, resolve_target: Callable[[], str | None] | None = None,
    policy: RoundPolicy | None = None,
) -> EngineParts:
    """RemoteVerifier for the target group's leader and, when there is a draft worker, a
    builder of its RemoteProposer; both under one lease for this router. policy (e.g. a
    LoadMonitor, started and stopped with the engine) decides γ.
    resolve_draft / resolve_target: where a worker serves after it went down (None = the same
    address); with resolve_target, a round waits up to serving.target_recovery_s for it."""
    from specdec_rpc.worker.internal_auth import configured_secret
    from specdec_rpc.worker.lease_renewer import new_lease_id
    from specdec_rpc.worker.remote_proposer import RemoteProposer
    from specdec_rpc.worker.remote_verifier import RemoteVerifier

    timeout_s = config.serving.worker_timeout_s
    # one lease for this router on both workers: a new one per start, so a restarted
    # replica never inherits (or keeps alive) the sequences of the one it replaces
    lease = {"lease_id": new_lease_id(), "lease_ttl_s": config.serving.lease_ttl_s,
             "secret": configured_secret(config.security.internal_secret_file)}
    # router replicas share the target's slots: each admits at most its share
    budget = max(1, config.cache.num_slots // config.serving.router_replicas)
    recovery_s = config.serving.target_recovery_s if resolve_target is not None else 0.0
    verifier = RemoteVerifier(target_address, timeout_s=timeout_s, slot_budget=budget, resolve=resolve_target,
                              recovery_s=recovery_s, **lease)

    def remote_draft() -> RemoteProposer:
        draft = RemoteProposer(draft_address, timeout_s=timeout_s, resolve=resolve_draft, **lease)
        draft.info()  # the draft answers (and is loaded) before the router reports SERVING
        return draft

    # the draft worker runs only when the draft proposer is configured (WorkerHub)
    return EngineParts(verifier, draft=remote_draft if draft_address is not None else None, policy=policy,
                       closers=[verifier.close])

