"""Bearer-token authentication of the public API, for both protocols' shims.

Tokens come from `security.api_tokens_file` (one per line, '#' comments) and the
SPECDEC_API_TOKENS environment variable (comma-separated). With none configured every call
is allowed (the embedded local demo); a configured file that holds no token is an error,
and a file that goes bad while serving keeps the last good tokens (`TokenSource`). A call presents
`authorization: Bearer <token>` (gRPC
metadata or an HTTP header); it is compared in constant time against every accepted token
(SHA-256 digests, so neither a token's length nor its position in the list leaks through
timing). A refusal says only that the token is missing or invalid. `TokenSource` re-reads
the file when it changes, so tokens rotate without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

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


def require_file_tokens(tokens_file: str) -> None:
    """A configured tokens file must hold a token: an empty one never means "no
    authentication" (that is an empty `security.api_tokens_file`). Raises ValueError."""
    if tokens_file and not read_tokens(tokens_file, environ={}):
        raise ValueError(f"security.api_tokens_file: {tokens_file} holds no token (to turn authentication off, "
                         "leave security.api_tokens_file empty)")


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
    `recheck_s`), so rotating a token in a mounted Kubernetes Secret needs no restart.

    Authentication is on exactly when a tokens file (or the env variable) is configured, and
    only a config change turns it off: a file that is emptied, deleted, unreadable, holds a
    malformed token, or was cut short (a token that is only the beginning of an accepted one)
    keeps the last good tokens and logs an error. A changed file is read only once it has
    stayed the same for one recheck (a non-atomic rewrite caught half way is not taken)."""

    def __init__(self, tokens_file: str, environ: Mapping[str, str] | None = None, recheck_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tokens_file, self.environ, self.recheck_s = tokens_file, environ, recheck_s
        self.clock = clock
        require_file_tokens(tokens_file)  # a bad file at start-up is a config error
        self._raw = read_tokens(tokens_file, environ)
        self._tokens = ApiTokens.of(self._raw)
        self._stamp = self._seen = self._file_stamp()
        self._refused: object = ()  # the stamp last refused (each is logged once)
        self._checked = self.clock()

    def _file_stamp(self) -> tuple[int, ...] | None:
        """What changes when the file is rewritten, replaced or its permissions change (None: gone)."""
        try:
            stat = os.stat(self.tokens_file)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_mode

    def current(self) -> ApiTokens:
        if self.tokens_file and self.clock() - self._checked >= self.recheck_s:
            self._checked = self.clock()
            stamp, seen = self._file_stamp(), self._seen
            self._seen = stamp
            if stamp != self._stamp and stamp == seen:  # changed, and settled since the last check
                self._reload(stamp)
        return self._tokens

    def _reload(self, stamp: tuple[int, ...] | None) -> None:
        """Take the file's tokens, unless it is unusable (then keep the last good ones, log once)."""
        try:
            raw = read_tokens(self.tokens_file, self.environ)
            tokens = ApiTokens.of(raw)
            problem = "holds no token" if not read_tokens(self.tokens_file, {}) else _cut_short(raw, self._raw)
        except (OSError, ValueError) as exc:  # (a bad encoding is a ValueError)
            problem = f"cannot be read ({type(exc).__name__}: {exc})"
        if problem is None:
            self._raw, self._tokens, self._stamp = raw, tokens, stamp
            return
        if stamp != self._refused:
            self._refused = stamp
            logger.error("security.api_tokens_file %s %s: keeping the last good tokens (authentication stays on; "
                         "to turn it off, change the config)", self.tokens_file, problem)

    def check(self, authorization: str | None) -> None:
        self.current().check(authorization)

    @property
    def enabled(self) -> bool:
        return self.current().enabled or bool(self.tokens_file)


def _cut_short(tokens: list[str], accepted: list[str]) -> str | None:
    """Why `tokens` look like a file cut short: a new token that is the beginning of an
    accepted one (None: they do not)."""
    known = set(accepted)
    if any(t not in known and any(a.startswith(t) for a in known) for t in tokens):
        return "looks cut short (a token is the beginning of an accepted one)"
    return None


def check_security_files(security: "SecurityConfig") -> None:  # noqa: F821 (typing only)
    """Fail fast, before Ray starts, on a security file that is not there: the tokens file,
    the TLS certificate and key, the internal secret. Raises ValueError naming the key."""
    require_file_tokens(security.api_tokens_file)
    for key in ("tls_cert_file", "tls_key_file", "internal_secret_file"):
        path = getattr(security, key)
        if path and not Path(path).is_file():
            raise ValueError(f"security.{key}: {path} is not a readable file")
