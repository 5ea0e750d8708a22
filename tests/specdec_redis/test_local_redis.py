"""The embedded default's redis-server child never outlives the process that started it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redis_server import require_redis_server

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
    code = "from specdec_redis.local_redis import LocalRedis; r = LocalRedis().start(); print(r.process.pid, flush=True); input()"
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
