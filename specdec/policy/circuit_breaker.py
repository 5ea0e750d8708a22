"""A small circuit breaker: stop calling a failing dependency for a while, then probe it."""

from __future__ import annotations

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class CircuitBreaker:
    """After `failure_threshold` consecutive failures the circuit opens: calls are skipped for
    `reset_timeout_s`; then one probe call is allowed (half-open) and its outcome closes or
    re-opens the circuit."""

    def __init__(self, failure_threshold: int = 3, reset_timeout_s: float = 1.0) -> None:
        if failure_threshold < 1 or reset_timeout_s < 0:
            raise ValueError("failure_threshold must be >= 1 and reset_timeout_s >= 0")
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self.failures = 0
        self.opened_at: float | None = None

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return CLOSED
        return HALF_OPEN if now - self.opened_at >= self.reset_timeout_s else OPEN

    def allow(self, now: float) -> bool:
        """Whether a call may be attempted now."""
        return self.state(now) != OPEN

    def record_success(self) -> None:
        self.failures = 0
        self.opened_at = None

    def record_failure(self, now: float) -> None:
        self.failures += 1
        if self.opened_at is not None or self.failures >= self.failure_threshold:
            self.opened_at = now
