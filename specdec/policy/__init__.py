"""The speculation policy: what a round costs, which γ each request drafts, and the load
measurements behind both (pure core: no ray, grpc or redis).

* `round_cost` - the measured cost model of a round at the current batch.
* `gamma` - γ per request by goodput (Dinkelbach over the cost model).
* `speculation_policy` - overrides, hysteresis and exploration around the plan.
* `load_switch` - the operator's QPS override with hysteresis and dwell.
* `load_stats`, `window_ring` - additive, time-bucketed measurements.
* `load_store` - the store interface (in-process here; Redis in `specdec_redis`).
* `load_monitor`, `circuit_breaker` - the background monitor and its fallback.
"""
