"""The router's metrics as a Prometheus registry of its own, for /metrics on the API port.

`prometheus_metric_classes(registry)` gives (Counter, Gauge, Histogram) makers with the
interface of Ray's metric classes (`inc` / `set` / `observe` with `tags`, `set_default_tags`),
backed by prometheus_client in `registry`; `tee_metric_classes` makes each metric in several
backends at once, so `RouterMetrics` keeps exporting through Ray's metrics agent and answers
/metrics from the same updates. Counters appear with prometheus_client's `_total` suffix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client import Histogram as _Histogram

Maker = Callable[..., Any]


class _Metric:
    """One prometheus_client metric behind Ray's metric interface."""

    def __init__(self, kind: type, registry: CollectorRegistry, name: str, description: str = "",
                 tag_keys: tuple[str, ...] = (), boundaries: list[float] | None = None) -> None:
        extra = {} if boundaries is None else {"buckets": boundaries}
        self._metric = kind(name, description or name, labelnames=tuple(tag_keys), registry=registry, **extra)
        self._tag_keys, self._defaults = tuple(tag_keys), {}

    def set_default_tags(self, tags: dict[str, str]) -> None:
        self._defaults = dict(tags)

    def _child(self, tags: dict[str, str] | None) -> Any:
        if not self._tag_keys:
            return self._metric
        merged = {**self._defaults, **(tags or {})}
        return self._metric.labels(**{key: merged.get(key, "") for key in self._tag_keys})

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self._child(tags).inc(value)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._child(tags).set(value)

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._child(tags).observe(value)


def prometheus_metric_classes(registry: CollectorRegistry) -> tuple[Maker, Maker, Maker]:
    """(Counter, Gauge, Histogram) makers registering in `registry`."""
    return tuple(lambda name, kind=kind, **kw: _Metric(kind, registry, name, **kw)
                 for kind in (_Counter, _Gauge, _Histogram))


class _Tee:
    """One metric made in several backends: every update goes to each."""

    def __init__(self, metrics: list[Any]) -> None:
        self._metrics = metrics

    def __getattr__(self, method: str) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:
            for metric in self._metrics:
                getattr(metric, method)(*args, **kwargs)

        return call


def tee_metric_classes(*class_sets: tuple[Maker, Maker, Maker]) -> tuple[Maker, Maker, Maker]:
    """(Counter, Gauge, Histogram) makers whose metrics exist in every one of `class_sets`."""
    return tuple(lambda name, makers=makers, **kw: _Tee([make(name, **kw) for make in makers])
                 for makers in zip(*class_sets))


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format."""
    return generate_latest(registry)
