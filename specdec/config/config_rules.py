"""Cross-field rules of the config schema: what the code built from a section enforces.

Each rule mirrors a check that a component makes when it is constructed at start-up (the
load switch's hysteresis, the policy's fallback γ, the time windows' buckets, a target
rank's resources, the two public ports) so that a config that would fail there is refused
by `specdec.config.config` instead, before anything starts, with the key named. The functions take
the validated section (pydantic models in `specdec.config.config` call them from their
`model_validator`s) and raise ValueError with the full key path in the message.
"""

from __future__ import annotations

from typing import Any


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_load_monitor(lm: Any) -> None:
    """LoadMonitorConfig: the operator's override (specdec.policy.load_switch.LoadThresholds),
    the policy's fallback γ (SpeculationPolicy) and the windows' buckets (WindowRing)."""
    _need((lm.disable_qps is None) == (lm.enable_qps is None),
          "load_monitor.disable_qps and load_monitor.enable_qps are set together (or neither)")
    if lm.disable_qps is not None:
        _need(lm.enable_qps < lm.disable_qps,
              f"load_monitor.enable_qps ({lm.enable_qps}) must be < load_monitor.disable_qps ({lm.disable_qps})")
    _need((lm.disable_in_flight is None) == (lm.enable_in_flight is None),
          "load_monitor.disable_in_flight and load_monitor.enable_in_flight are set together (or neither)")
    if lm.disable_in_flight is not None:
        _need(lm.disable_qps is not None,
              "load_monitor.disable_in_flight is part of the operator override: set load_monitor.disable_qps "
              "and load_monitor.enable_qps with it")
        _need(lm.enable_in_flight < lm.disable_in_flight,
              f"load_monitor.enable_in_flight ({lm.enable_in_flight}) must be < "
              f"load_monitor.disable_in_flight ({lm.disable_in_flight})")
    _need(lm.fallback_gamma <= lm.gamma_max,
          f"load_monitor.fallback_gamma ({lm.fallback_gamma}) must be <= load_monitor.gamma_max ({lm.gamma_max})")
    _need(lm.bucket_s <= lm.window_s,
          f"load_monitor.bucket_s ({lm.bucket_s}) must be <= load_monitor.window_s ({lm.window_s})")
    _need(lm.cost_window_s >= lm.window_s,
          f"load_monitor.cost_window_s ({lm.cost_window_s}) must be >= load_monitor.window_s ({lm.window_s})")


def check_serving(serving: Any) -> None:
    """ServingConfig: a target rank needs some resource (actors.target_group.rank_bundle),
    nccl needs GPUs, and the public ports differ (both proxies and, with ingress direct, the
    router replicas' own ports bind serving.host)."""
    _need(serving.port != serving.http_port,
          f"serving.port and serving.http_port are both {serving.port}: the gRPC and HTTP APIs need a port each")
    _need(serving.target_num_cpus > 0 or serving.target_num_gpus > 0,
          "serving.target_num_cpus and serving.target_num_gpus are both 0: a target rank needs resources")
    _need(serving.distributed_backend != "nccl" or serving.target_num_gpus > 0,
          "serving.distributed_backend: nccl needs GPUs (serving.target_num_gpus > 0); use gloo or auto on CPU")
    if serving.ingress == "direct":
        _check_direct_ports(serving)


DIRECT_PORTS_PER_REPLICA = 4


def direct_ports(first: int, router_replicas: int) -> range:
    """The ports the router replicas' direct gRPC (or HTTP) servers take from `first` on: four per
    replica. The spare ones stand in for ports another process holds and for the HTTP port of a
    replica killed with connections open (in TIME_WAIT for a minute, and Serve, failing to bind
    it for the replacement, keeps it out of its pool for good)."""
    return range(first, first + DIRECT_PORTS_PER_REPLICA * router_replicas)


def _check_direct_ports(serving: Any) -> None:
    """With ingress direct: both port ranges exist and clash with neither each other nor the proxies' ports."""
    grpc_ports = direct_ports(serving.direct_port, serving.router_replicas)
    http_ports = direct_ports(serving.direct_http_port, serving.router_replicas)
    for key, ports in (("serving.direct_port", grpc_ports), ("serving.direct_http_port", http_ports)):
        _need(ports[-1] <= 65535, f"{key}: its {len(ports)} ports ({ports[0]}-{ports[-1]}) end past 65535")
        for other in ("port", "http_port"):
            _need(getattr(serving, other) not in ports,
                  f"serving.{other} ({getattr(serving, other)}) is one of {key}'s ports ({ports[0]}-{ports[-1]})")
    _need(not set(grpc_ports) & set(http_ports),
          f"serving.direct_port's ports ({grpc_ports[0]}-{grpc_ports[-1]}) and serving.direct_http_port's "
          f"({http_ports[0]}-{http_ports[-1]}) overlap")


def check_generation(generation: Any) -> None:
    """GenerationConfig: the default budget is one a request may ask for (specdec.requests.request)."""
    _need(generation.max_new_tokens <= generation.max_new_tokens_limit,
          f"generation.max_new_tokens ({generation.max_new_tokens}) must be <= "
          f"generation.max_new_tokens_limit ({generation.max_new_tokens_limit})")


def check_cache(cache: Any, default_kv_tokens: int) -> None:
    """CacheConfig: without a memory budget the pool holds ``default_kv_tokens`` tokens, and one
    sequence of max_seq_len must fit it (the runner refuses a pool that cannot hold one)."""
    if cache.memory_budget is None and cache.max_seq_len is not None:
        _need(cache.max_seq_len <= default_kv_tokens,
              f"cache.max_seq_len ({cache.max_seq_len}) is more than the {default_kv_tokens} tokens the default "
              "cache.memory_budget holds: set cache.memory_budget (bytes, or a fraction of device memory)")
