"""The load store on a Redis that requires a password and TLS (rediss://), as a team's shared
Redis would: measurements go through with the right password and CA, and nothing goes
through without them."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from specdec.wiring.ports import free_port
from specdec_redis.redis_load_store import RedisLoadStore
from redis_server import require_redis_server
from specdec.policy.load_stats import StatsWindow

PASSWORD = "team-redis-password"


@pytest.fixture(scope="module")
def tls_redis(tls_files):
    require_redis_server()
    cert, key = tls_files
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--requirepass", PASSWORD, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url, password=PASSWORD).ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.skip("this redis-server was built without TLS")
            time.sleep(0.1)
    yield url
    process.kill()
    process.wait()


def test_measurements_go_through_with_the_password_and_the_ca(tls_redis):
    store = RedisLoadStore(tls_redis, deployment="tls", password=PASSWORD, timeout_s=0.05)
    window = StatsWindow()
    window.add_arrival(3)
    now = time.time()
    assert store.push("replica-a", window, now, in_flight=2, queued=1, push_id="p1")
    snapshot = store.snapshot(now)
    assert snapshot.in_flight == 2 and snapshot.qps == pytest.approx(3 / store.window_s)
    store.close()


def test_without_the_password_or_over_plaintext_nothing_goes_through(tls_redis):
    plaintext = tls_redis.replace("rediss://", "redis://").split("?")[0]
    for url, password in ((tls_redis, None), (tls_redis, "wrong"), (plaintext, PASSWORD)):
        store = RedisLoadStore(url, deployment="tls", password=password, timeout_s=0.2)
        with pytest.raises(redis.RedisError):
            store.snapshot(time.time())
        store.close()
