"""The start waits until every router replica's own ports serve (serving.ingress direct), TLS
or not: over TLS each replica's HTTPS port answers for it (its gRPC port has no plaintext twin),
so a start returns only once that port's /health answers 200, and times out when it never does.

A real HTTPS server on 127.0.0.1 (the tests' self-signed certificate) stands for a replica's
HTTP port; it answers 503 (still loading) a given number of times before 200.
"""

from __future__ import annotations

import http.server
import ssl
import threading

import pytest

from actors.app import wait_until_replicas_serve


class Replica:
    """An HTTPS /health that answers 503 `loading` times, then 200; counts the probes it got."""

    def __init__(self, cert, key, loading: int) -> None:
        replica = self
        self.probes, self.loading = 0, loading

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                replica.probes += 1
                ready = self.path == "/health" and replica.probes > replica.loading
                self.send_response(200 if ready else 503)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas(tls_files):
    started: list[Replica] = []

    def start(loading: int) -> Replica:
        started.append(Replica(*tls_files, loading))
        return started[-1]

    yield start
    for replica in started:
        replica.close()


def test_over_tls_the_start_waits_until_each_replicas_https_port_answers_200(replicas):
    ready, loading = replicas(0), replicas(2)
    wait_until_replicas_serve(["127.0.0.1:1", "127.0.0.1:2"], [ready.url, loading.url], tls=True, timeout_s=30)
    assert ready.probes == 1
    assert loading.probes == 3, "probed until the replica answered 200"


def test_over_tls_a_replica_that_never_serves_times_the_start_out(replicas):
    stuck = replicas(10**6)
    with pytest.raises(TimeoutError, match="/health did not answer 200"):
        wait_until_replicas_serve(["127.0.0.1:1"], [stuck.url], tls=True, timeout_s=1.5)
    assert stuck.probes >= 2
