"""A comma-separated list of addresses becomes one gRPC target of one family: host names are
resolved up front, and a list gRPC cannot dial (mixed families, a name that does not resolve,
a malformed entry) is refused naming its entry, before any channel exists; the client and the
command line both read it so. The asyncio client resolves off its event loop (at its first
call), the command line once."""

import asyncio
import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from specdec_cli.serve_cli import build_parser, main
from specdec_rpc.public import direct_targets
from specdec_rpc.public.client import AsyncSpecdecClient, SpecdecClient, channel_target
from specdec_rpc.public.direct_targets import several_addresses

HOSTS = {"both": ["10.0.0.7", "fd00::7"], "v4": ["10.0.0.8", "10.0.0.9"], "v6": ["fd00::6"]}


def resolve(host: str, port: int) -> list[str]:
    if host not in HOSTS:
        raise OSError(f"unknown host {host}")
    return HOSTS[host]


@pytest.mark.parametrize("target, dialled", [
    ("127.0.0.1:40000,127.0.0.1:40001", "ipv4:127.0.0.1:40000,127.0.0.1:40001"),
    ("127.0.0.1:40000, 10.0.0.2:40000", "ipv4:127.0.0.1:40000,10.0.0.2:40000"),
    ("[::1]:40000,[::1]:40001", "ipv6:[::1]:40000,[::1]:40001"),
    # a name takes the list's family; all of its addresses of that family join the list
    ("both:1,127.0.0.1:2", "ipv4:10.0.0.7:1,127.0.0.1:2"),
    ("[::1]:2,both:1", "ipv6:[::1]:2,[fd00::7]:1"),
    ("both:1,v4:1", "ipv4:10.0.0.7:1,10.0.0.8:1,10.0.0.9:1"),
    ("both:1,v6:1", "ipv6:[fd00::7]:1,[fd00::6]:1"),  # names only: IPv4 unless one of them has none
    ("v4:1,10.0.0.8:1", "ipv4:10.0.0.8:1,10.0.0.9:1"),  # an address listed twice is dialled once
])
def test_a_list_becomes_one_family_of_ip_addresses(target, dialled):
    assert several_addresses(target, resolve) == (dialled, target.split(",")[0].strip())


@pytest.mark.parametrize("target, message", [
    ("127.0.0.1:1,[::1]:2", "entry 1 '127.0.0.1:1' is IPv4 and entry 2 '[::1]:2' is IPv6"),
    ("[::1]:2,v4:1", "entry 2 'v4:1': 'v4' has no IPv6 address"),
    ("v4:1,v6:1", "entry 1 'v4:1': 'v4' has no IPv6 address"),  # not every name has IPv4: IPv6
    ("127.0.0.1:1,nowhere:2", "entry 2 'nowhere:2': cannot resolve 'nowhere': unknown host nowhere"),
    ("127.0.0.1:1,", "entry 2 '': empty"),
    ("127.0.0.1,127.0.0.1:2", "entry 1 '127.0.0.1': HOST:PORT expected"),
    ("127.0.0.1:1,127.0.0.1:70000", "entry 2 '127.0.0.1:70000': HOST:PORT expected"),
    ("[::1:1,[::1]:2", "entry 1 '[::1:1': an IPv6 address is written [ADDRESS]:PORT"),
])
def test_a_list_grpc_cannot_dial_is_refused_naming_its_entry(target, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        several_addresses(target, resolve)


def test_one_address_is_left_to_grpc():
    assert channel_target("some-host:50051")[0] == "some-host:50051"


@pytest.fixture(scope="module")
def server_port():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


def test_a_list_with_a_host_name_reaches_the_server(server_port):
    # gRPC's ipv4: scheme alone refuses "localhost" (the channel fails with an opaque error)
    with SpecdecClient(f"localhost:{server_port},127.0.0.1:{server_port}", timeout_s=10, retries=0) as client:
        assert client.health() == "SERVING"


def test_the_command_line_refuses_a_mixed_list_naming_the_entry(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["client", "health", "--server", "127.0.0.1:1,[::1]:2"])
    assert exit_.value.code == 2 and "entry 2 '[::1]:2' is IPv6" in capsys.readouterr().err
    args = build_parser().parse_args(["client", "health", "--server", "127.0.0.1:1,127.0.0.1:2"])
    assert args.server == "127.0.0.1:1,127.0.0.1:2"


@pytest.fixture
def resolutions(monkeypatch):
    """The system resolver replaced: "localhost" is 127.0.0.1, any other name fails; each
    resolution is recorded as (host, the thread it ran on)."""
    seen = []

    def system_resolve(host, port):
        seen.append((host, threading.current_thread()))
        if host != "localhost":
            raise OSError(f"unknown host {host}")
        return ["127.0.0.1"]

    monkeypatch.setattr(direct_targets, "system_resolve", system_resolve)
    return seen


def test_the_async_client_resolves_a_list_off_its_event_loop(server_port, resolutions):
    async def main_():
        client = AsyncSpecdecClient(f"localhost:{server_port},127.0.0.1:{server_port}", timeout_s=10, retries=0)
        assert resolutions == []  # the constructor ran on the loop: nothing resolved there
        async with client:
            return threading.current_thread(), await client.health(), await client.health()

    loop_thread, *statuses = asyncio.run(main_())
    assert statuses == ["SERVING", "SERVING"]
    assert [host for host, _ in resolutions] == ["localhost"]  # once, at the first call
    assert resolutions[0][1] is not loop_thread


def test_the_async_client_refuses_a_bad_list_before_sending_anything(resolutions):
    with pytest.raises(ValueError, match="entry 2 '127.0.0.1': HOST:PORT expected"):
        AsyncSpecdecClient("127.0.0.1:1,127.0.0.1")  # a malformed entry: refused at once
    with pytest.raises(ValueError, match=r"entry 2 '\[::1\]:2' is IPv6"):
        AsyncSpecdecClient("127.0.0.1:1,[::1]:2")

    async def first_call():
        async with AsyncSpecdecClient("nowhere:1,127.0.0.1:1", retries=0) as client:
            with pytest.raises(ValueError, match="entry 1 'nowhere:1': cannot resolve 'nowhere'"):
                await client.generate("x")  # a ValueError, not an RpcError: no channel was made
            with pytest.raises(ValueError, match="cannot resolve 'nowhere'"):
                await client.connect()

    asyncio.run(first_call())


def test_the_command_line_resolves_a_list_once(server_port, resolutions, capsys):
    assert main(["client", "health", "--server", f"localhost:{server_port},127.0.0.1:{server_port}"]) == 0
    assert capsys.readouterr().out.strip() == "SERVING"
    assert [host for host, _ in resolutions] == ["localhost"]


def test_the_command_line_refuses_a_name_that_does_not_resolve_naming_it(resolutions, capsys):
    assert main(["client", "health", "--server", "127.0.0.1:1,nowhere:2"]) == 2
    assert "argument --server: entry 2 'nowhere:2': cannot resolve 'nowhere'" in capsys.readouterr().err
