"""The shared secret between the router and the workers (internal gRPC traffic).

Every router -> worker call carries the secret in its metadata (`secret_channel`); a
worker server with `SecretInterceptor` refuses a call without it (UNAUTHENTICATED) before
any handler runs, so a process that merely reaches a worker's port cannot read or change
its cache. The secret comes from `security.internal_secret_file`, else the
SPECDEC_INTERNAL_SECRET environment variable (`configured_secret`), read by the routers
and the workers alike; with neither, internal calls are not authenticated (the Helm chart
always sets one: its Secret is mounted on every Ray pod; `specdec serve` starting its own
Ray generates one for the run: `specdec_cli.local_workers`).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

METADATA_KEY = "x-specdec-internal-secret"
SECRET_ENV = "SPECDEC_INTERNAL_SECRET"


def configured_secret(secret_file: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured secret (file, then env), None when neither sets one."""
    environ = os.environ if environ is None else environ
    if secret_file:
        path = Path(secret_file)
        if not path.is_file():
            raise ValueError(f"security.internal_secret_file: {secret_file} is not a readable file")
        secret = path.read_text(encoding="utf-8").strip()
        if not secret:
            raise ValueError(f"security.internal_secret_file: {secret_file} is empty")
        return secret
    return environ.get(SECRET_ENV, "").strip() or None


def _presented(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == METADATA_KEY:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


class SecretInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call whose metadata lacks the secret (compared in constant time)."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the internal secret must not be empty")
        self._secret = secret.encode("utf-8")
        self._refuse = grpc.unary_unary_rpc_method_handler(self._abort)
        self._refuse_stream = grpc.unary_stream_rpc_method_handler(self._abort_stream)
        self._refuse_streams = grpc.stream_stream_rpc_method_handler(self._abort_stream)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        presented = _presented(details.invocation_metadata).encode("utf-8")
        if handler is None or hmac.compare_digest(presented, self._secret):
            return handler
        if handler.stream_stream is not None:
            return self._refuse_streams
        return self._refuse_stream if handler.unary_stream is not None else self._refuse

    @staticmethod
    async def _abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "internal call without the cluster's secret")

    async def _abort_stream(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._abort(request, context)
        yield  # pragma: no cover - never reached: abort raises


class _SecretMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                      grpc.StreamStreamClientInterceptor):
    """Adds the secret to every call's metadata (a synchronous channel's interceptor)."""

    def __init__(self, secret: str) -> None:
        self._entry = (METADATA_KEY, secret)

    def _with_secret(self, details: Any) -> Any:
        return _Details(details, [*(details.metadata or ()), self._entry])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_secret(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_secret(details), request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_secret(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method, self.timeout, self.metadata = base.method, base.timeout, metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def secret_channel(address: str, secret: str | None, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """An insecure channel to `address` whose calls present `secret` (None: none)."""
    channel = grpc.insecure_channel(address, options=options or [])
    return grpc.intercept_channel(channel, _SecretMetadata(secret)) if secret else channel
