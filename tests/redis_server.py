"""A real redis-server for tests: specdec_redis.local_redis.LocalRedis, skipped (or failed in CI) when missing."""

from __future__ import annotations

import os

import pytest

from specdec_redis.local_redis import LocalRedis, redis_server_binary


def require_redis_server() -> None:
    """Skip without redis-server; in CI fail instead (.ci/run must have installed it)."""
    if redis_server_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (.ci/run installs it with apt-get)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


class RedisServer(LocalRedis):
    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        require_redis_server()
        super().start(timeout_s)
        return self
