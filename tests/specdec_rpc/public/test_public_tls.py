"""TLS on the public gRPC port: the servicer function adds a TLS port to the server it is
given (as Serve's proxy calls it), from files named in its environment."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from specdec.wiring.ports import free_port
from specdec_rpc.public.public_tls import add_tls_port_to_server, tls_environment


def test_the_environment_names_readable_files_or_the_setting_is_refused(tls_files, tmp_path):
    cert, key = tls_files
    env = tls_environment(4443, str(cert), str(key))
    assert env["SPECDEC_TLS_PORT"] == "4443" and env["SPECDEC_TLS_CERT_FILE"] == str(cert.resolve())
    with pytest.raises(ValueError, match="security.tls_key_file"):
        tls_environment(4443, str(cert), str(tmp_path / "absent.pem"))


def test_clients_reach_the_tls_port_with_the_certificate_and_not_in_plaintext(tls_files):
    cert, key = tls_files
    port = free_port()

    async def scenario():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        add_tls_port_to_server(None, server, tls_environment(port, str(cert), str(key)))
        await server.start()
        try:
            credentials = grpc.ssl_channel_credentials(cert.read_bytes())
            async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_without_a_port_in_the_environment_nothing_is_added():
    class Server:
        def add_secure_port(self, *args):
            raise AssertionError("no TLS port was asked for")

    add_tls_port_to_server(None, Server(), {})
