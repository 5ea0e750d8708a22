"""Bearer-token authentication of the public API, for both protocols' shims.

Tokens come from `security.api_tokens_file` (one per line, '#' comments) and the
SPECDEC_API_TOKENS environment variable (comma-separated). With none configured every call
is allowed (the embedded local demo). A call presents `authorization: Bearer <token>` (gRPC
metadata or an HTTP header); it is compared in constant time against every accepted token
(SHA-256 digests, so neither a token's length nor its position in the list leaks through
timing). A refusal says only that the token is missing or invalid.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
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
