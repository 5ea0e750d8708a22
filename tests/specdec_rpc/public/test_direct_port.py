"""A router replica's own gRPC port (serving.ingress direct): it binds serving.host, speaks TLS
whenever a certificate is configured (no plaintext beside it) and the TLS servicer function
adds nothing to it."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from specdec.wiring.ports import free_port
from specdec_rpc.public import direct_port
from specdec_rpc.public.public_tls import add_tls_port_to_server, tls_environment


async def _check(address: str, credentials: grpc.ChannelCredentials | None) -> int:
    channel = (grpc.aio.secure_channel(address, credentials) if credentials else grpc.aio.insecure_channel(address))
    async with channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


def test_with_a_certificate_the_direct_port_speaks_tls_on_the_host_and_refuses_plaintext(tls_files):
    cert, key = tls_files
    port = free_port()
    environ = {"SPECDEC_BIND_HOST": "127.0.0.1", **tls_environment(50051, str(cert), str(key))}

    async def scenario():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        assert direct_port.bind(server, f"[::]:{port}", environ) == f"127.0.0.1:{port}"
        assert direct_port.speaks_tls(server)
        add_tls_port_to_server(None, server, environ)  # Serve's servicer functions run next: nothing added
        await server.start()
        try:
            tls = grpc.ssl_channel_credentials(cert.read_bytes())
            assert await _check(f"localhost:{port}", tls) == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await _check(f"127.0.0.1:{port}", None)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError):  # the proxy's TLS port was not added here
                await _check("localhost:50051", tls)
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_without_a_certificate_the_direct_port_is_plaintext_on_the_host():
    port = free_port()

    async def scenario():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        direct_port.bind(server, f"[::]:{port}", {"SPECDEC_BIND_HOST": "127.0.0.1"})
        assert not direct_port.speaks_tls(server)
        await server.start()
        try:
            assert await _check(f"127.0.0.1:{port}", None) == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_a_port_taken_is_a_runtime_error_so_serve_tries_another():
    port = free_port()

    no_reuse = [("grpc.so_reuseport", 0)]  # as Serve creates a replica's server

    async def scenario():
        taken = grpc.aio.server(options=no_reuse)
        taken.add_insecure_port(f"127.0.0.1:{port}")
        await taken.start()
        try:
            with pytest.raises(RuntimeError):
                direct_port.bind(grpc.aio.server(options=no_reuse), f"[::]:{port}", {"SPECDEC_BIND_HOST": "127.0.0.1"})
        finally:
            await taken.stop(None)

    asyncio.run(scenario())


def test_outside_a_serve_replica_it_is_not_a_direct_port():
    assert not direct_port.in_replica()
