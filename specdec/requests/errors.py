"""Core exceptions that shells map to protocol status codes."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker failed a whole call (unreachable, timed out, crashed): no single row of
    the batch caused it, so the round fails every row it carried (UNAVAILABLE)."""


class InvalidRequestError(ValueError):
    """Bad input; `param` names the field (the message starts with it too)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
