"""The embedded default's redis-server child never outlives the process that started it,
and, kept alive, is started again when it dies."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redis_server import RedisServer, require_redis_server

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux-only")
def test_redis_child_stops_when_its_parent_is_killed():
    require_redis_server()
    code = ("from specdec_redis.local_redis import LocalRedis; r = LocalRedis().start(); "
            "print(r.process.pid, flush=True); input()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    redis_pid = int(parent.stdout.readline())
    assert alive(redis_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while alive(redis_pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(redis_pid)


def test_a_kept_alive_redis_server_that_dies_is_started_again_on_its_port(caplog):
    """`specdec serve`'s redis-server: killed, it serves again on the same port within
    seconds (so the routers go back to cluster-wide measurements), and the death is logged."""
    redis = RedisServer().start().keep_alive(period_s=0.1)
    try:
        first = redis.process.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.time() + 15
        while (redis.restarts == 0 or not answers(redis.port)) and time.time() < deadline:
            time.sleep(0.05)
        assert redis.restarts == 1 and redis.process.pid != first and alive(redis.process.pid)
        assert answers(redis.port)
        assert any(r.levelname == "ERROR" and "died" in r.message for r in caplog.records)
    finally:
        redis.stop()
    time.sleep(0.3)
    assert redis.restarts == 1 and not answers(redis.port), "stop() is final: nothing starts it again"


def answers(port: int) -> bool:
    """Whether redis-server answers PING on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False
