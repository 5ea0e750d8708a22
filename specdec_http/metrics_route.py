"""GET /metrics on the API port: Prometheus' text format of a registry (the router's metrics,
`specdec_metrics.prometheus_metrics`), so a scraper needs no access to Ray's metrics agent.
The numbers are this replica's."""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import Response

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsRoute:
    """render: the current exposition text (bytes); refresh: called first, when the metrics
    are not polled by anyone else (None: they are, e.g. by the router's exporter thread)."""

    def __init__(self, render: Callable[[], bytes], refresh: Callable[[], None] | None = None) -> None:
        self.render = render
        self.refresh = refresh

    async def __call__(self, request) -> Response:
        if self.refresh is not None:
            self.refresh()
        return Response(self.render(), media_type=CONTENT_TYPE)
