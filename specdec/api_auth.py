"""Bearer-token authentication of the public API, for both protocols' shims.

Tokens come from `security.api_tokens_file` (one per line, '#' comments) and the
SPECDEC_API_TOKENS environment variable (comma-separated). With none configured every call
is allowed (the embedded local demo). A call presents `authorization: Bearer <token>` (gRPC
metadata or an HTTP header); it is compared in constant time against every accepted token
(SHA-256 digests, so neither a token's length nor its position in the list leaks through
timing). A refusal says only that the token is missing or invalid. `TokenSource` re-reads
the file when it changes, so tokens rotate without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

TOKENS_ENV = "SPECDEC_API_TOKENS"
SCHEME = "bearer"


class AuthenticationError(Exception):
    """No valid bearer token (UNAUTHENTICATED / 401); the message never echoes the token."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def read_tokens(tokens_file: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The accepted tokens: the file's non-empty, non-comment lines, then the env variable's."""
    environ = os.environ if environ is None else environ
    tokens: list[str] = []
    if tokens_file:
        path = Path(tokens_file)
        if not path.is_file():
            raise ValueError(f"security.api_tokens_file: {tokens_file} is not a readable file")
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                tokens.append(line)
    tokens.extend(t.strip() for t in environ.get(TOKENS_ENV, "").split(",") if t.strip())
    return tokens


@dataclass(frozen=True)
class ApiTokens:
    """The accepted tokens (as digests). Empty = authentication off."""

    digests: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, tokens: list[str]) -> "ApiTokens":
        if any(any(c.isspace() for c in t) for t in tokens):
            raise ValueError("an API token must not contain whitespace")
        return cls(tuple(_digest(t) for t in tokens))

    @classmethod
    def load(cls, tokens_file: str, environ: Mapping[str, str] | None = None) -> "ApiTokens":
        return cls.of(read_tokens(tokens_file, environ))

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def check(self, authorization: str | None) -> None:
        """Raise AuthenticationError unless `authorization` is 'Bearer <an accepted token>'
        (or authentication is off)."""
        if not self.enabled:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != SCHEME or not token.strip():
            raise AuthenticationError("missing bearer token (send 'authorization: Bearer <token>')")
        presented = _digest(token.strip())
        matched = False
        for digest in self.digests:  # no early exit: every token is compared
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            raise AuthenticationError("invalid bearer token")


class TokenSource:
    """The accepted tokens, re-read when the tokens file changes (checked at most every
    `recheck_s`), so rotating a token in a mounted Kubernetes Secret needs no restart. A
    file that became unreadable keeps the last tokens (and fails closed if there were none
    before: a configured file that cannot be read never means "no authentication")."""

    def __init__(self, tokens_file: str, environ: Mapping[str, str] | None = None, recheck_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tokens_file, self.environ, self.recheck_s = tokens_file, environ, recheck_s
        self.clock = clock
        self._tokens = ApiTokens.load(tokens_file, environ)  # a bad file at start-up is a config error
        self._stamp = self._file_stamp()
        self._checked = self.clock()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.tokens_file)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def current(self) -> ApiTokens:
        if self.tokens_file and self.clock() - self._checked >= self.recheck_s:
            self._checked = self.clock()
            stamp = self._file_stamp()
            if stamp is not None and stamp != self._stamp:
                try:
                    self._tokens = ApiTokens.load(self.tokens_file, self.environ)
                    self._stamp = stamp
                except (OSError, ValueError):
                    pass  # half-written or unreadable: keep the last good tokens
        return self._tokens

    def check(self, authorization: str | None) -> None:
        self.current().check(authorization)

    @property
    def enabled(self) -> bool:
        return self.current().enabled or bool(self.tokens_file)


def check_security_files(security: "SecurityConfig") -> None:  # noqa: F821 (typing only)
    """Fail fast, before Ray starts, on a security file that is not there: the tokens file,
    the TLS certificate and key, the internal secret. Raises ValueError naming the key."""
    read_tokens(security.api_tokens_file, environ={})
    for key in ("tls_cert_file", "tls_key_file", "internal_secret_file"):
        path = getattr(security, key)
        if path and not Path(path).is_file():
            raise ValueError(f"security.{key}: {path} is not a readable file")
