"""LoadMonitorConfig: the `load_monitor` section (the goodput policy and the shared load store)."""

from __future__ import annotations

from pydantic import Field, model_validator

from specdec.config.config_rules import check_load_monitor
from specdec.config.strict_model import StrictModel


class LoadMonitorConfig(StrictModel):
    enabled: bool = Field(True,
                          description="Choose γ per request and round by goodput (else: always speculation.gamma).")
    redis_url: str = Field(
        "", description="Shared Redis, e.g. redis://host:6379/0 ('' = env SPECDEC_REDIS_URL, or local/in-process)."
    )
    deployment: str = Field("default", description="Key namespace in Redis; one per specdec deployment.")
    window_s: float = Field(10.0, gt=0, description="Sliding window of QPS and batch measurements, seconds.")
    bucket_s: float = Field(1.0, gt=0, description="Time bucket of the window (its resolution), seconds.")
    cost_window_s: float = Field(
        60.0, gt=0, description="Sliding window of the round timings the cost model is fitted on and of the "
        "acceptance the policy plans with, seconds (>= window_s): both belong to the deployment, not to the "
        "moment's load."
    )
    refresh_s: float = Field(0.1, gt=0, description="Background push/refresh period of each router, seconds.")
    timeout_s: float = Field(0.05, gt=0, le=0.05, description="Redis call timeout, seconds (<= 50 ms).")
    replica_ttl_s: float = Field(5.0, gt=0, description="A router silent this long no longer counts, seconds.")
    breaker_failures: int = Field(3, ge=1, description="Consecutive Redis failures that open the circuit breaker.")
    breaker_reset_s: float = Field(1.0, ge=0, description="Seconds before an open breaker probes Redis again.")
    gamma_max: int = Field(
        8, ge=0, le=32, description="Largest γ the policy may choose (a request's own γ: speculation.gamma_limit)."
    )
    fallback_gamma: int = Field(2, ge=0, description="γ when measurements are missing or stale (a safe default).")
    stale_after_s: float = Field(3.0, gt=0, description="Measurements older than this are ignored, seconds.")
    min_gain: float = Field(
        0.05, ge=0, description="The cost model's error band (fraction): speculation comes back on after it went "
        "off only where the goodput plan predicts >= this gain over plain decoding at the batch the demand keeps in "
        "flight; while it is on, a round of no more rows than that batch (nothing queued) speculates unless plain "
        "decoding is predicted this much faster, other rounds only for this gain."
    )
    prior_tokens: float = Field(
        200.0, ge=0, description="A request's own acceptance weighs against the cluster's as if the cluster had "
        "drafted this many tokens for it (shrinkage; 0 = the request's own only). Set it near how many drafted "
        "tokens it takes before a request's own acceptance says more than chance (README: 'The goodput policy')."
    )
    explore_interval_s: float = Field(
        5.0, ge=0, description="While few drafts are measured (speculation off), at most one round per this many "
        "seconds lets a few requests the plan gives γ = 0 draft anyway, so acceptance and the draft's cost stay "
        "measured (0 = never)."
    )
    explore_gamma: int = Field(4, ge=1, description="Exploration rounds draft 1, 2, … this many tokens in turn.")
    explore_rows: int = Field(1, ge=1, description="At most this many requests draft in an exploration round.")
    max_round_ratio: float = Field(
        0.0, ge=0, description="A round the policy plans may take at most this many times as long as the same "
        "batch decoded plainly while it reads a newcomer's prompt (its mean, measured; or this round's prompts "
        "when longer): plain decoding's own long rounds, predicted by the cost model. A request whose first "
        "draft is rejected gets one token for the whole round, so this bounds how far speculation stretches "
        "the gap between two tokens (the ITL tail) past plain decoding's, at the cost of speculating less. "
        "0 = unbounded (pure goodput)."
    )
    tpot_target_ms: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="A request's time-per-output-token target when it sets none "
        "(speculation.tpot_target_ms), milliseconds: the policy plans the most tokens/s whose predicted per-token "
        "time meets every running request's target (docs/goodput.md). null = no target (tokens/s alone)."
    )
    disable_qps: float | None = Field(
        None, gt=0, description="Operator override: cluster-wide requests/s above which speculation is forced off "
        "(null = the goodput plan decides from measured costs)."
    )
    enable_qps: float | None = Field(
        None, ge=0, description="With disable_qps: requests/s below which it may turn on again (< disable_qps)."
    )
    disable_in_flight: float | None = Field(
        None, gt=0, description="With disable_qps: requests in flight + queued above which it is forced off too "
        "(null = the override looks at QPS only)."
    )
    enable_in_flight: float | None = Field(
        None, ge=0, description="With disable_in_flight: in flight + queued below which it may turn on again "
        "(< disable_in_flight)."
    )
    min_dwell_s: float = Field(1.0, ge=0, description="Least time between two on/off changes, seconds (no flapping).")

    @model_validator(mode="after")
    def _consistent(self) -> "LoadMonitorConfig":
        check_load_monitor(self)
        return self
