"""Finished requests, kept until the metrics exporter collects them.

The frontend adds one `FinishedRequest` per request that ended (finished, stopped, failed,
cancelled or out of time), from whichever protocol served it; the exporter (`drain`,
about once a second) turns them into counters and histograms. Bounded: if nobody drains,
the oldest are dropped rather than growing without limit.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

CANCELLED, DEADLINE = "cancelled", "deadline"  # finish reasons of requests that did not finish


@dataclass(frozen=True)
class FinishedRequest:
    prompt_tokens: int  # tokens of the prompt (after the chat template)
    generation_tokens: int  # tokens generated (0 for a request that failed before its first round)
    finish_reason: str  # "length", "stop", "error", CANCELLED, DEADLINE ...
    latency_s: float  # end to end: arrival at the frontend -> last token (or failure)
    queue_s: float  # waiting for a cache slot before the first round
    streaming: bool  # streamed (GenerateStream, SSE) or unary
    cached_tokens: int = 0  # prompt tokens the target's prefix cache held (not computed)


class RequestLog:
    def __init__(self, limit: int = 10_000) -> None:
        self._items: deque[FinishedRequest] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(self, item: FinishedRequest) -> None:
        with self._lock:
            self._items.append(item)

    def drain(self) -> list[FinishedRequest]:
        """Everything added since the last drain, oldest first."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items
