"""A redis-server child process on a free loopback port: the embedded default's shared store
(`specdec serve` without a Redis URL) and the tests' real Redis."""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time

from actors.ports import free_port

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child (Linux): get SIGTERM when the parent dies, even by SIGKILL, so no
    redis-server outlives the `specdec serve` or test process that started it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class LocalRedis:
    """Starts `redis-server` (no persistence) on 127.0.0.1; `stop()` kills it. Start it from a
    long-lived thread: Linux sends the parent-death signal when the *thread* that started the
    child exits (so a redis-server started from a short-lived thread dies with it)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "LocalRedis":
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not on PATH (e.g. apt-get install redis-server)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
