"""Assemble an engine from config: tokenizer, target runner, proposers (with the tokenizer check).

Two builders, named for what they build: `build_engine`, a SpeculativeEngine (in-process
models unless given a verifier and proposer), and `build_served_engine`, a served engine
(the engine loop, its proposers, tokenizer, defaults and load monitor) for every backend.
A backend contributes only its `EngineParts`: the target side and how to get the draft
model (in-process models: `local_parts`; gRPC clients of worker actors, local or on a Ray
cluster: `specdec_rpc.worker.router_backend.remote_parts`) and the round policy; which proposers
exist and which are loaded is `specdec.proposers.proposer_registry`'s. The request caps are built once
from config here (`RequestCaps.from_config`) and handed to the engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.proposers import proposer_registry as registry
from specdec.config.config import CacheConfig, ModelsConfig, SpecdecConfig, SpeculationConfig
from specdec.round.draft_ahead import DraftAhead
from specdec.requests.request import RequestCaps
from specdec.requests.token_decode import tokenizer_decode
from specdec.round.engine import SpeculativeEngine
from specdec.serving.async_engine import AsyncEngine
from specdec.policy.load_monitor import build_load_monitor
from specdec.policy.speculation_policy import RoundPolicy
from specdec.models.model_paths import resolve_model_path
from specdec.models.emulated_profile import is_emulated, load_profile, parse_emulated_name
from specdec.models.emulated_tokenizer import emulated_tokenizer
from specdec.models.loader import resolve_checkpoint_dir
from specdec.models.model_runner import ModelRunner
from specdec.models.runners import open_runner
from specdec.verifiers.verifier import Verifier
from specdec.proposers.base import Proposer
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.proposers.no_proposer import NoProposer
from specdec.serving.served_engine import ServedEngine, ServerDefaults, prompt_char_limit
from specdec.verifiers.target_verifier import TargetVerifier
from specdec.sampling.grammar_xgrammar import XGrammarBackend
from specdec.wiring.tokenizer_check import check_tokenizers_compatible


def load_tokenizer(name: str) -> Any:
    if is_emulated(name):
        return emulated_tokenizer(load_profile(parse_emulated_name(name).profile).language.vocab_size)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name))


def eos_token_ids(name: str, tokenizer: Any) -> tuple[int, ...]:
    """Every id that ends a sequence, as transformers' generate() stops: the eos_token_id of
    generation_config.json (an int or a list; instruct models often list several), else of
    config.json, plus the tokenizer's own (an emulated model's: the tokenizer's only)."""
    if is_emulated(name):
        return (tokenizer.eos_token_id,)
    directory = resolve_checkpoint_dir(resolve_model_path(name))
    ids: list[int] = []
    for file in ("generation_config.json", "config.json"):
        path = directory / file
        value = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        if value is not None:
            ids.extend(value if isinstance(value, list) else [value])
            break
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(int(i) for i in ids))


def decoder(tokenizer: Any):
    """ids -> text, as every output is decoded (special tokens skipped; `tokenizer_decode`)."""
    return tokenizer_decode(tokenizer)


def server_gamma(config: SpecdecConfig) -> int:
    """The server's γ: the configured one, 0 when the configured proposer is 'none'."""
    return 0 if config.speculation.proposer == registry.NONE else config.speculation.gamma


def _speculative_engine(
    config: SpecdecConfig, verifier: Verifier, proposer: Proposer, tokenizer: Any, policy: RoundPolicy | None = None
) -> SpeculativeEngine:
    """The engine for `config` over the given verifier and proposer (in-process or remote).
    It drafts ahead (pipelined rounds) when configured and the verifier runs concurrently."""
    ahead = config.speculation.overlap and verifier.runs_concurrently
    eos = eos_token_ids(config.models.target, tokenizer)
    return SpeculativeEngine(
        verifier,
        proposer,
        gamma=server_gamma(config),
        eos_token_ids=eos,
        decode=decoder(tokenizer),
        policy=policy,
        caps=RequestCaps.from_config(config),
        draft_ahead=build_draft_ahead() if ahead else None,
        prefill_chunk_tokens=config.scheduling.prefill_chunk_tokens,
        grammars=XGrammarBackend(tokenizer, eos),
        prefill_slowdown=config.scheduling.prefill_slowdown,
    )


def build_draft_ahead() -> DraftAhead:
    """Pipelined rounds (speculation.overlap): how each kind of step overlaps drafting with
    verifying (OverlapChoice) and how many branches a look-ahead drafts (LookAheadHits) are
    measured, not configured."""
    return DraftAhead()


def load_runner(name: str, models: ModelsConfig, cache: CacheConfig) -> ModelRunner:
    """The model's runner (own runtime, transformers fallback or emulated: `open_runner` logs which)."""
    return open_runner(resolve_model_path(name), cache.num_slots, cache.max_seq_len, models.dtype, models.device,
                       models.runner, time_scale=models.device_time_scale, block_size=cache.block_size,
                       memory_budget=cache.memory_budget, prefix_caching=cache.prefix_caching,
                       kv_tokens=cache.kv_tokens)


def build_proposer(
    speculation: SpeculationConfig, models: ModelsConfig, cache: CacheConfig, target: ModelRunner, tokenizer: Any
) -> Proposer:
    """The configured proposer. N-gram lookup is always available (requests may pick it);
    a draft model is loaded only for the 'draft' proposer, after the tokenizer check."""
    if speculation.proposer == registry.NONE:
        return NoProposer()
    proposers = registry.build_proposers(speculation.proposer, {
        registry.NGRAM: registry.ngram_builder(speculation),
        registry.DRAFT: lambda: load_draft_proposer(models, cache, target.vocab_size, tokenizer),
    })
    return CompositeProposer(proposers, default=speculation.proposer)


def load_draft_proposer(
    models: ModelsConfig, cache: CacheConfig, target_vocab_size: int, target_tokenizer: Any, wire_dtype=None
) -> DraftModelProposer:
    """Load the draft model and check it speaks the target's vocabulary."""
    draft_tokenizer = load_tokenizer(models.draft)
    draft = load_runner(models.draft, models, cache)
    check_tokenizers_compatible(target_tokenizer, draft_tokenizer, target_vocab_size, draft.vocab_size)
    return DraftModelProposer(draft, vocab_size=target_vocab_size, wire_dtype=wire_dtype)


@dataclass
class BuiltEngine:
    engine: SpeculativeEngine
    tokenizer: Any
    config: SpecdecConfig

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def build_engine(
    config: SpecdecConfig, verifier: Verifier | None = None, proposer: Proposer | None = None, tokenizer: Any = None,
    policy: RoundPolicy | None = None,
) -> BuiltEngine:
    """A SpeculativeEngine for `config`: on in-process models (the configured proposer) unless
    given a verifier and proposer, under the same goodput policy as the server (its
    measurements kept in this process) unless load_monitor.enabled is false (then always
    speculation.gamma) or a policy is given."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.models.target)
    if verifier is None or proposer is None:
        target = load_runner(config.models.target, config.models, config.cache)
        verifier = TargetVerifier(target)
        proposer = build_proposer(config.speculation, config.models, config.cache, target, tokenizer)
    if policy is None and config.load_monitor.enabled:
        policy = build_load_monitor(config.load_monitor, None, "in-process")
    return BuiltEngine(_speculative_engine(config, verifier, proposer, tokenizer, policy), tokenizer, config)


def _served(
    config: SpecdecConfig, verifier: Verifier, proposers: dict[str, Proposer], tokenizer: Any,
    policy: RoundPolicy | None = None,
) -> ServedEngine:
    """A CompositeProposer over `proposers` (the configured one is the default), the engine
    loop with the admission limit, and the server's defaults. policy: decides each round's
    γ for AUTO requests from the load (None = the static γ)."""
    default = config.speculation.proposer if config.speculation.proposer in proposers else next(iter(proposers))
    engine = _speculative_engine(config, verifier, CompositeProposer(proposers, default=default), tokenizer, policy)
    loop = AsyncEngine(engine, config.serving.max_concurrent_requests, on_idle=lambda: _flush(verifier, proposers),
                       defer_handoff=getattr(verifier, "sends_on_round_stream", False))
    return ServedEngine(
        loop=loop,
        encode=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        decode=engine.decode,
        defaults=ServerDefaults(
            config.generation.max_new_tokens, server_gamma(config), tuple(sorted(proposers)),
            prompt_char_limit(verifier.max_seq_len, tokenizer),
        ),
        model=config.models.target,
        tokenizer=tokenizer,
    )


def _flush(verifier: Verifier, proposers: dict[str, Proposer]) -> None:
    """Send releases that remote clients buffer until their next call."""
    for part in (verifier, *proposers.values()):
        flush = getattr(part, "flush", None)
        if flush is not None:
            flush()


@dataclass
class EngineParts:
    """What one backend contributes to a served engine (everything else comes from config).

    verifier: the target side (in-process, or a gRPC client of the target group).
    draft: builds the draft-model proposer (None: no draft model here; n-gram only).
    policy: the round policy (None = the static γ); a LoadMonitor is started with the
        engine, stopped when it closes, and reported in its status.
    tokenizer: the target's tokenizer (None = load it from config).
    closers: called when the engine closes (e.g. the verifier's gRPC channel).
    """

    verifier: Verifier
    draft: Callable[[], Proposer] | None = None
    policy: RoundPolicy | None = None
    tokenizer: Any = None
    closers: list[Callable[[], None]] = field(default_factory=list)


def build_served_engine(config: SpecdecConfig, parts: EngineParts | None = None) -> ServedEngine:
    """The served engine of every backend (parts: what the backend contributes; None = the
    in-process models, `local_parts`): the registry's proposers (n-gram always, the draft
    model when the backend has one), the engine loop, the defaults, the load monitor."""
    parts = parts if parts is not None else local_parts(config)
    tokenizer = parts.tokenizer if parts.tokenizer is not None else load_tokenizer(config.models.target)
    loaded = registry.DRAFT if parts.draft is not None else registry.NGRAM
    proposers = registry.build_proposers(loaded, {
        registry.NGRAM: registry.ngram_builder(config.speculation), registry.DRAFT: parts.draft,
    })
    served = _served(config, parts.verifier, proposers, tokenizer, parts.policy)
    served.closers.extend(parts.closers)
    served.closers.extend(p.close for p in proposers.values() if hasattr(p, "close"))
    start, stop = getattr(parts.policy, "start", None), getattr(parts.policy, "stop", None)
    if callable(start) and callable(stop):  # a LoadMonitor: its thread lives as long as the engine
        start()
        served.closers.append(stop)
        served.monitor = parts.policy
    return served


def local_parts(config: SpecdecConfig) -> EngineParts:
    """In-process models (no workers, no network): the draft model loaded whatever the
    configured proposer, so requests may pick either; the static γ."""
    tokenizer = load_tokenizer(config.models.target)
    target = load_runner(config.models.target, config.models, config.cache)
    draft = lambda: load_draft_proposer(config.models, config.cache, target.vocab_size, tokenizer)  # noqa: E731
    return EngineParts(TargetVerifier(target), draft=draft, tokenizer=tokenizer)
