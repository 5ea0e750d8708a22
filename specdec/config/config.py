"""Typed, strict configuration.

`configs/default.yaml` documents every key; these pydantic models are the schema (each
field carries a description, unknown keys are errors) and a test keeps the YAML and the
defaults here identical. Each component receives only its own section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from specdec.config.config_rules import check_cache, check_generation, check_serving
from specdec.config.load_monitor_config import LoadMonitorConfig
from specdec.config.strict_model import StrictModel
from specdec.proposers.proposer_registry import DRAFT, ProposerName


# K/V tokens per model without a cache.memory_budget: the memory of the slot cache's former default
# (16 slots of 1,024 tokens), now shared by as many sequences as their lengths allow
DEFAULT_KV_TOKENS = 16 * 1024


class ModelsConfig(StrictModel):
    target: str = Field("bundled:target",
                        description="Target model: a local HF directory, a hub id, or 'bundled:target'.")
    draft: str = Field("bundled:draft",
                       description="Draft model for the 'draft' proposer: local dir, hub id or 'bundled:draft'.")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="Compute dtype of both models; float32 on CPU (half precision is slow there)."
    )
    device: str = Field("cpu", description="torch device, e.g. 'cpu' or 'cuda:0'.")
    runner: Literal["auto", "specdec", "transformers"] = Field(
        "auto", description="Runtime of both models: 'auto' = the own runtime for the families it implements "
        "(llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3), transformers' modeling code (exact, slower, no "
        "tensor parallelism) for any other causal LM; 'specdec' refuses other models; 'transformers' always.",
    )
    device_time_scale: float = Field(
        1.0, ge=0, description="Emulated models only ('emulated:<profile>:<role>', configs/devices/): multiplies "
        "every emulated device time (tests and quick runs scale it down; 1 = the profile's times).",
    )


class CacheConfig(StrictModel):
    num_slots: int = Field(
        256, ge=1, le=4096, description="Cap on the sequences (with look-ahead forks) decoded at once per model; "
        "below it the blocks memory_budget holds decide, each sequence admitted on its prompt + max_new_tokens.",
    )
    max_seq_len: int | None = Field(
        None, ge=2, description="Tokens per sequence (prompt + generated); must not exceed the model's context. "
        "None: the model's context (max_position_embeddings), at most the tokens memory_budget holds.",
    )
    block_size: int = Field(16, ge=1, le=1024, description="Tokens per KV-cache block (the paged cache's unit).")
    memory_budget: float | None = Field(
        None, gt=0, description="KV-cache memory per model: bytes when > 1, else a fraction of the device's "
        f"memory; at most num_slots x max_seq_len tokens are kept. None: the K/V of {DEFAULT_KV_TOKENS} tokens "
        "(what 16 sequences of 1,024 tokens took before the cache was paged).",
    )
    prefix_caching: bool = Field(
        True, description="Reuse the KV blocks of prompt prefixes seen before (content-addressed, LRU-evicted).",
    )

    @property
    def kv_tokens(self) -> int | None:
        """Tokens of K/V each model's pool holds when no memory_budget is set (None when one is)."""
        return DEFAULT_KV_TOKENS if self.memory_budget is None else None

    @model_validator(mode="after")
    def _one_sequence_fits(self) -> "CacheConfig":
        check_cache(self, DEFAULT_KV_TOKENS)
        return self


class SchedulingConfig(StrictModel):
    prefill_chunk_tokens: int = Field(
        256, ge=0, description="Chunked prefill: prompt tokens the target (and the draft) read per round, over all "
        "new requests, between the decode rounds of running ones, so a long prompt does not stall them; 0 = each "
        "prompt whole in its first round (lowest time to first token for a lone long prompt).",
    )
    prefill_slowdown: float = Field(
        0.15, ge=0, le=10, description="While requests decode, the chunks of prompts longer than "
        "prefill_chunk_tokens lengthen their rounds by at most this share on average (each round by about twice "
        "it), from measured round times: a chunk is the decode rows' γ + 1 tokens (it rides their verify "
        "forward), wider only where that leaves most of the per-round bound unused (a GPU), so a client sending "
        "long prompts costs the decoding streams a bounded share of their speed (larger: chunks in more rounds, "
        "faster time to first token for long prompts); a prompt that fits "
        "prefill_chunk_tokens is read at once, unpaced; 0 = every round reads prefill_chunk_tokens whatever it "
        "costs the decoding streams.",
    )


class NgramConfig(StrictModel):
    n_min: int = Field(2, ge=1, description="Shortest context suffix (tokens) the n-gram proposer tries to match.")
    n_max: int = Field(4, ge=1, description="Longest context suffix (tokens) it tries first.")

    @model_validator(mode="after")
    def _ordered(self) -> "NgramConfig":
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) must be <= n_max ({self.n_max})")
        return self


# keys that were removed or renamed -> what to set instead (refused, naming the replacement)
RETIRED_SPECULATION_KEYS = {
    "gamma_max": "renamed: set speculation.gamma_limit (the largest γ a request may ask for; "
                 "load_monitor.gamma_max is the policy's own cap)",
    "overlap_measured": "removed: with speculation.overlap a lone request's rounds always measure whether "
                        "looking ahead is faster here (specdec/round/overlap_choice.py)",
    "overlap_min_acceptance": "removed: a row drafts ahead while its own measured acceptance is at least 0.3 "
                              "(specdec/round/draft_ahead.py)",
    "look_ahead_min_hit_rate": "removed: whether greedy and sampled rows look ahead is measured, for each kind "
                               "of step apart (specdec/round/overlap_choice.py)",
    "look_ahead_probe_every": "removed: each kind of step measures again now and then whether looking ahead "
                              "pays (specdec/round/overlap_choice.py)",
    "overlap_micro_batches": "removed: with speculation.overlap steps of several requests measure micro-batches "
                             "against sequential rounds and looking ahead (specdec/round/overlap_choice.py)",
    "overlap_max_rows": "removed: with speculation.overlap each number of requests in a step measures whether "
                        "looking ahead pays (specdec/round/overlap_choice.py)",
    "look_ahead_branches": "removed: a look-ahead drafts the branches whose measured hit rate earns them "
                           "(specdec/round/look_ahead_hits.py)",
}


class SpeculationConfig(StrictModel):
    proposer: ProposerName = Field(
        DRAFT, description="Who guesses tokens: a draft model, n-gram prompt lookup, or none (plain decoding)."
    )
    gamma: int = Field(4, ge=0, le=64, description="γ: tokens proposed per round (0 = plain decoding).")
    gamma_limit: int = Field(
        16, ge=0, le=64, description="Largest γ a request may ask for; larger ones are refused (bad input)."
    )
    ngram: NgramConfig = Field(default_factory=NgramConfig, description="Settings of the n-gram proposer.")
    overlap: bool = Field(
        True, description="Draft while the target verifies (pipelined rounds; only where the target is remote); "
        "each kind of step measures sequential rounds, looking ahead and micro-batches and keeps the fastest."
    )

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        for key in RETIRED_SPECULATION_KEYS.keys() & (data.keys() if isinstance(data, dict) else set()):
            raise ValueError(f"speculation.{key}: {RETIRED_SPECULATION_KEYS[key]}")
        return data

    @model_validator(mode="after")
    def _gamma_within_cap(self) -> "SpeculationConfig":
        if self.gamma > self.gamma_limit:
            raise ValueError(f"gamma ({self.gamma}) must be <= gamma_limit ({self.gamma_limit})")
        return self


class GenerationConfig(StrictModel):
    max_new_tokens: int = Field(128, ge=1, description="Default generated-token budget of a request.")
    max_new_tokens_limit: int = Field(
        4096, ge=1, description="Largest max_new_tokens a request may ask for (bad-input guard)."
    )
    max_stop_strings: int = Field(
        16, ge=0, le=1024, description="Most stop strings (and, separately, stop token ids) a request may send."
    )
    max_stop_string_chars: int = Field(256, ge=1, description="Longest stop string a request may send, characters.")

    @model_validator(mode="after")
    def _default_within_limit(self) -> "GenerationConfig":
        check_generation(self)
        return self


class ServingConfig(StrictModel):
    host: str = Field("0.0.0.0", description="Interface the public gRPC and HTTP ports (Ray Serve's proxies) bind to "
                                             "(with TLS, Serve's plaintext gRPC port binds loopback).")
    port: int = Field(50051, ge=1, le=65535, description="Public gRPC port (Ray Serve's gRPC proxy).")
    http_port: int = Field(
        8000, ge=1, le=65535, description="Public HTTP port: the OpenAI-compatible API (Ray Serve's HTTP proxy)."
    )
    ingress: Literal["proxy", "direct"] = Field(
        "proxy", description="How clients reach the router replicas. proxy: through Ray Serve's gRPC and HTTP "
        "proxies only (serving.port, serving.http_port). direct: also each router replica's own gRPC and HTTP "
        "ports (Ray Serve's direct ingress: no proxy process on a stream's path), bound to serving.host, with TLS "
        "and tokens as on the proxy; the proxies keep serving beside them. Ray must start with it: `specdec serve` "
        "starts it so, the Helm chart sets it on every Ray pod.",
    )
    direct_port: int = Field(
        40000, ge=1, le=65535, description="With ingress direct: the first of the router replicas' direct gRPC "
        "ports; each replica takes a free one of the 4 x router_replicas ports from here (a replica that replaces "
        "a dead one takes its port again when it can; the spare ones stand in for ports that are held).",
    )
    direct_http_port: int = Field(
        30000, ge=1, le=65535, description="With ingress direct: the first of the router replicas' direct HTTP "
        "ports (the OpenAI-compatible API), 4 x router_replicas of them as for direct_port.",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="Target shard actors (ranks); heads must divide evenly.")
    target_num_gpus: float = Field(0.0, ge=0, description="GPUs per target rank actor (1 in production, 0 on CPU).")
    draft_num_gpus: float = Field(0.0, ge=0, description="GPUs of the draft worker actor (1 in production, 0 on CPU).")
    target_num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per target rank actor.")
    draft_num_cpus: float = Field(1.0, ge=0, description="CPUs reserved for the draft worker actor.")
    distributed_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend of the target group; auto = nccl on GPU, gloo on CPU."
    )
    max_concurrent_requests: int = Field(
        64, ge=1, description="Admission limit of a router replica (running + queued); beyond it: RESOURCE_EXHAUSTED."
    )
    worker_timeout_s: float = Field(30.0, gt=0, description="Deadline of one router -> worker gRPC call, seconds.")
    worker_host: str = Field(
        "", description="Interface the workers' internal gRPC servers bind: empty = this node's address (routers "
        "on other nodes reach it; `specdec serve` starting its own Ray uses 127.0.0.1), 127.0.0.1 = loopback only."
    )
    router_replicas: int = Field(1, ge=1, description="Ray Serve replicas of the router deployment.")
    lease_ttl_s: float = Field(
        5.0, gt=0, description="A worker frees the slots of a router it has not heard from for this long, seconds."
    )
    placement_timeout_s: float = Field(
        120.0, gt=0, description="Longest wait for the workers' resources (GPU nodes may be booting), seconds."
    )
    start_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for a worker to load its model and serve, seconds."
    )
    idle_release_s: float = Field(
        120.0, ge=0, description="Release the workers after no router held a lease this long, seconds (0 = never)."
    )
    target_recovery_s: float = Field(
        120.0, ge=0, description="How long a round waits for a re-formed target group before failing, seconds."
    )
    shutdown_grace_s: float = Field(
        20.0, ge=0, le=3600, description="On SIGTERM / SIGINT: how long in-flight requests may run on while new "
        "ones are refused, before the rest end as unavailable and everything stops, seconds (the Helm chart's "
        "terminationGracePeriodSeconds covers it).",
    )
    target_hang_s: float = Field(
        30.0, gt=0, description="A target rank that has not answered the supervisor's heartbeat for this long is "
        "taken for hung (alive but stuck) and the group is re-formed, seconds; above the slowest single forward.",
    )

    @model_validator(mode="after")
    def _startable(self) -> "ServingConfig":
        check_serving(self)
        return self


class SecurityConfig(StrictModel):
    tls_cert_file: str = Field(
        "", description="PEM certificate chain of the public endpoints (gRPC and HTTP); empty = plaintext."
    )
    tls_key_file: str = Field("", description="PEM private key for tls_cert_file; set both or neither.")
    api_tokens_file: str = Field(
        "", description="File of bearer tokens, one per line ('#' comments); with env SPECDEC_API_TOKENS "
        "(comma-separated) the accepted tokens. None from either = no authentication. A set file must hold a "
        "token; one that goes bad while serving (emptied, cut short, deleted) keeps the last good tokens."
    )
    open_health: bool = Field(
        True, description="Health checks (and gRPC reflection) answer without a token, for probes and load balancers."
    )
    internal_secret_file: str = Field(
        "", description="File holding the shared secret router and workers present to each other; env "
        "SPECDEC_INTERNAL_SECRET also works. Neither = internal calls are not authenticated (`specdec serve` "
        "starting its own Ray then generates one for the run)."
    )
    cors_allowed_origins: list[str] = Field(
        default_factory=list, description="Browser origins (scheme://host[:port], or '*' for any) allowed to call the "
        "HTTP API cross-origin (CORS); their preflights are answered without a token. Empty = CORS off."
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> "SecurityConfig":
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("security.tls_cert_file and security.tls_key_file are set together (or neither)")
        return self

    @model_validator(mode="after")
    def _origins(self) -> "SecurityConfig":
        for origin in self.cors_allowed_origins:
            scheme, _, host = origin.partition("://")
            if origin != "*" and (scheme not in ("http", "https") or not host or "/" in host):
                raise ValueError(f"security.cors_allowed_origins: {origin!r} is not an origin "
                                 "(scheme://host[:port] without a path, or '*')")
        return self


class SpecdecConfig(StrictModel):
    models: ModelsConfig = Field(default_factory=ModelsConfig, description="Which checkpoints to load and how.")
    cache: CacheConfig = Field(default_factory=CacheConfig, description="KV-cache sizing (target and draft).")
    scheduling: SchedulingConfig = Field(
        default_factory=SchedulingConfig, description="How prompts share rounds with running requests."
    )
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig, description="Proposer and γ.")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="Request defaults and limits.")
    serving: ServingConfig = Field(default_factory=ServingConfig, description="Distributed serving (Ray + gRPC).")
    load_monitor: LoadMonitorConfig = Field(
        default_factory=LoadMonitorConfig, description="Cluster-wide load measurements and the γ / on-off policy."
    )
    security: SecurityConfig = Field(
        default_factory=SecurityConfig, description="TLS and bearer tokens of the public API, the internal secret."
    )

    @model_validator(mode="after")
    def _policy_within_cap(self) -> "SpecdecConfig":
        if self.load_monitor.gamma_max > self.speculation.gamma_limit:
            raise ValueError(
                f"load_monitor.gamma_max ({self.load_monitor.gamma_max}) must be <= "
                f"speculation.gamma_limit ({self.speculation.gamma_limit})"
            )
        if self.models.runner == "transformers" and self.serving.tensor_parallel_size > 1:
            raise ValueError("models.runner 'transformers' cannot be tensor-parallel: serving.tensor_parallel_size "
                             f"is {self.serving.tensor_parallel_size}; use 1 or the own runtime ('auto'/'specdec')")
        return self


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class ConfigError(ValueError):
    """A configuration that cannot be used, in one line naming the file and the key."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(*paths: str | Path, overrides: dict[str, Any] | None = None) -> SpecdecConfig:
    """Defaults, then each YAML file in order, then `overrides` (a nested dict) on top.
    Raises ConfigError naming the file (or the command line) and the key."""
    sources: list[tuple[str, dict[str, Any]]] = [(str(path), read_yaml(path)) for path in paths]
    sources.append(("command line", overrides or {}))
    data: dict[str, Any] = {}
    for _, layer in sources:
        data = _deep_merge(data, layer)
    try:
        return SpecdecConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, sources)) from None


def _explain(exc: ValidationError, sources: list[tuple[str, dict[str, Any]]]) -> str:
    """The first problem in one line: where it was set, the key, what is wrong (no URL)."""
    error = exc.errors(include_url=False)[0]
    loc = tuple(str(part) for part in error["loc"])
    key = ".".join(loc) or "(top level)"
    origin = next((name for name, layer in reversed(sources) if _has_key(layer, loc)), "defaults")
    if error["type"] == "extra_forbidden":
        problem = "unknown key"
    else:
        problem = error["msg"].removeprefix("Value error, ")
        if loc and not isinstance(error["input"], dict):
            problem += f" (got {error['input']!r})"
    more = len(exc.errors()) - 1
    named = problem.startswith((f"{key}.", f"{key}:"))  # a cross-field rule names its keys itself
    return f"{origin}: {'' if named else f'{key}: '}{problem}" + (f" (and {more} more)" if more else "")


def _has_key(layer: dict[str, Any], loc: tuple[str, ...]) -> bool:
    node: Any = layer
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return bool(loc)
