"""What the public service runs on: an AsyncEngine over a verifier and a proposer, plus the
tokenizer and the server's defaults. Built either on gRPC clients of the workers (the
distributed router) or on in-process models (tests, single-machine use)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.config import SpecdecConfig
from specdec.speculation_policy import RoundPolicy
from specdec.engine_builder import make_engine, server_gamma
from specdec.engine_loop import AsyncEngine
from specdec.proposers.base import Proposer
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.proposers.ngram_proposer import NgramProposer
from specdec.verifier import Verifier
from specdec_rpc.public_api import ServerDefaults, prompt_char_limit


@dataclass
class RouterBackend:
    """A running engine loop and what the public API needs around it.

    closers: called (in order) by close() after the loop stopped, e.g. gRPC channels.
    """

    loop: AsyncEngine
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    defaults: ServerDefaults
    closers: list[Callable[[], None]] = field(default_factory=list)
    monitor: Any = None  # the LoadMonitor deciding γ, when there is one (for GetStats)

    def close(self) -> None:
        self.loop.shutdown()
        for close in self.closers:
            close()


def make_backend(
    config: SpecdecConfig,
    verifier: Verifier,
    proposers: dict[str, Proposer],
    tokenizer: Any,
    policy: RoundPolicy | None = None,
) -> RouterBackend:
    """Wire a backend: CompositeProposer over `proposers` (the configured one is the default).
    policy: decides each round's γ for AUTO requests from the load (None = the static γ)."""
    default = config.speculation.proposer if config.speculation.proposer in proposers else next(iter(proposers))
    engine = make_engine(config, verifier, CompositeProposer(proposers, default=default), tokenizer, policy)
    loop = AsyncEngine(engine, config.serving.max_concurrent_requests, on_idle=lambda: _flush(verifier, proposers))
    return RouterBackend(
        loop=loop,
        encode=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        decode=engine.decode,
        defaults=ServerDefaults(
            config.generation.max_new_tokens, server_gamma(config), tuple(sorted(proposers)),
            prompt_char_limit(verifier.max_seq_len, tokenizer),
        ),
    )


def _flush(verifier: Verifier, proposers: dict[str, Proposer]) -> None:
    """Send releases that remote clients buffer until their next call."""
    for part in (verifier, *proposers.values()):
        flush = getattr(part, "flush", None)
        if flush is not None:
            flush()


def remote_backend(
    config: SpecdecConfig, target_address: str, draft_address: str | None, policy: RoundPolicy | None = None,
    resolve_draft: Callable[[], str | None] | None = None,
) -> RouterBackend:
    """The distributed router's backend: RemoteVerifier for the target group's leader,
    RemoteProposer for the draft worker (when there is one) and in-process n-gram lookup.
    resolve_draft: the draft worker's address after it went down (None = the same address)."""
    from specdec.engine_builder import load_tokenizer
    from specdec_rpc.remote_proposer import RemoteProposer
    from specdec_rpc.remote_verifier import RemoteVerifier

    from specdec_rpc.lease_renewer import new_lease_id

    timeout_s = config.serving.worker_timeout_s
    # one lease for this router on both workers: a new one per start, so a restarted
    # replica never inherits (or keeps alive) the sequences of the one it replaces
    lease = {"lease_id": new_lease_id(), "lease_ttl_s": config.serving.lease_ttl_s}
    # router replicas share the target's slots: each admits at most its share
    budget = max(1, config.cache.num_slots // config.serving.router_replicas)
    verifier = RemoteVerifier(target_address, timeout_s=timeout_s, slot_budget=budget, **lease)
    proposers: dict[str, Proposer] = {"ngram": NgramProposer(config.speculation.ngram.n_min, config.speculation.ngram.n_max)}
    if draft_address is not None:
        draft = RemoteProposer(draft_address, timeout_s=timeout_s, resolve=resolve_draft, **lease)
        draft.info()  # the draft answers (and is loaded) before the router reports SERVING
        proposers["draft"] = draft
    backend = make_backend(config, verifier, proposers, load_tokenizer(config.models.target), policy)
    backend.closers.extend(p.close for p in (verifier, *proposers.values()) if hasattr(p, "close"))
    return backend


def local_backend(config: SpecdecConfig) -> RouterBackend:
    """An in-process backend on the configured models (no workers, no network)."""
    from specdec.engine_builder import load_draft_proposer, load_runner, load_tokenizer
    from specdec.target_verifier import TargetVerifier

    tokenizer = load_tokenizer(config.models.target)
    target = load_runner(config.models.target, config.models, config.cache)
    proposers: dict[str, Proposer] = {
        "ngram": NgramProposer(config.speculation.ngram.n_min, config.speculation.ngram.n_max),
        "draft": load_draft_proposer(config.models, config.cache, target.vocab_size, tokenizer),
    }
    return make_backend(config, TargetVerifier(target), proposers, tokenizer)
