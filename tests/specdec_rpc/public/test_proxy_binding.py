"""Where Serve's gRPC proxy binds: `serving.host` without TLS, loopback beside specdec's TLS
port, and a TLS port is refused beside a plaintext port that other hosts reach."""

import pytest

from specdec_rpc.public.proxy_binding import (HOST_ENV, add_grpc_address, host_port, is_loopback, local_host,
                                       plaintext_address, serve_grpc_address)
from specdec_rpc.public.public_tls import PORT_ENV, add_tls_port_to_server, tls_environment


class ServeLikeServer:
    """Records ports like grpc.aio.Server; `service_handler_factory` marks Serve's gRPC server."""

    service_handler_factory = None

    def __init__(self):
        self.insecure, self.secure = [], []

    def add_insecure_port(self, address):
        self.insecure.append(address)
        return 1

    def add_secure_port(self, address, credentials):
        self.secure.append(address)
        return 1


def test_serves_port_binds_the_configured_host_and_loopback_beside_tls():
    assert serve_grpc_address("[::]:9000", {HOST_ENV: "127.0.0.1"}) == "127.0.0.1:9000"
    assert serve_grpc_address("[::]:9000", {HOST_ENV: "::1"}) == "[::1]:9000"
    assert serve_grpc_address("[::]:9000", {HOST_ENV: "0.0.0.0", PORT_ENV: "50051"}) == "127.0.0.1:9000"
    assert serve_grpc_address("[::]:9000", {}) == "[::]:9000"  # no hook settings: Serve's own choice


def test_addresses_clients_on_this_host_use():
    assert host_port("::", 5) == "[::]:5" and host_port("10.0.0.1", 5) == "10.0.0.1:5"
    assert local_host("0.0.0.0") == local_host("::") == "127.0.0.1" and local_host("10.0.0.1") == "10.0.0.1"
    for address in ("127.0.0.1:1", "[::1]:1", "[::ffff:127.0.0.1]:1", "localhost:1"):
        assert is_loopback(address), address
    for address in ("0.0.0.0:1", "[::]:1", "192.0.2.2:1", "example.com:1", None):
        assert not is_loopback(address), address


def test_the_tls_port_binds_the_host_beside_a_loopback_plaintext_port(tls_files, monkeypatch):
    cert, key = tls_files
    environ = {**tls_environment(50051, str(cert), str(key)), HOST_ENV: "0.0.0.0"}
    monkeypatch.setattr("os.environ", environ)
    server = ServeLikeServer()
    add_grpc_address(server, "[::]:9000")
    assert server.insecure == ["127.0.0.1:9000"] == [plaintext_address(server)]
    add_tls_port_to_server(None, server, environ)
    assert server.secure == ["0.0.0.0:50051"]


def test_a_tls_port_beside_a_plaintext_port_open_to_the_network_is_refused(tls_files):
    cert, key = tls_files
    server = ServeLikeServer()
    server.add_insecure_port("[::]:9000")  # Serve bound it itself: the start-up hook did not run
    with pytest.raises(OSError, match="bypass TLS"):
        add_tls_port_to_server(None, server, tls_environment(50051, str(cert), str(key)))
    assert server.secure == []
