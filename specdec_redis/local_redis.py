"""A redis-server child process on a free loopback port: the embedded default's shared store
(`specdec serve` without a Redis URL) and the tests' real Redis.

`keep_alive()` restarts it on the same port whenever it dies (logged as an error), so a
`specdec serve` whose redis-server was killed goes back to cluster-wide measurements
(the routers' circuit breakers close again) instead of staying on local ones for good.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from specdec.wiring.ports import free_port

logger = logging.getLogger(__name__)

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
        self.restarts = 0  # times keep_alive() started it again after it died
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "LocalRedis":
        with self._lock:
            self._spawn(timeout_s)
        return self

    def _spawn(self, timeout_s: float) -> None:
        """Start redis-server and wait until its port answers (raises otherwise, none left running)."""
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
                return
            except OSError:
                time.sleep(0.05)
        self._kill()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def keep_alive(self, period_s: float = 0.5) -> "LocalRedis":
        """Check every period_s that it runs; start it again (same port) when it died, until stop()."""
        self._stopping.clear()
        self._keeper = threading.Thread(target=self._keep, args=(period_s,), name="local-redis-keeper", daemon=True)
        self._keeper.start()  # a long-lived thread: the children it starts get the parent-death signal right
        return self

    def _keep(self, period_s: float) -> None:
        while not self._stopping.wait(period_s):
            with self._lock:
                if self._stopping.is_set() or self.process is None or self.process.poll() is None:
                    continue
                logger.error("redis-server on port %d died (exit status %s): the load monitor is on local "
                             "measurements; starting it again", self.port, self.process.returncode)
                try:
                    self._spawn(10.0)
                except (OSError, RuntimeError) as exc:
                    logger.error("restarting redis-server on port %d failed (retrying): %s", self.port, exc)
                    continue
                self.restarts += 1
                logger.warning("redis-server is back on port %d", self.port)

    def stop(self) -> None:
        self._stopping.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=15)
        with self._lock:
            self._kill()

    def _kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
