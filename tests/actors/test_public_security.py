"""The public API as an operator deploys it: TLS and bearer tokens on both protocols through
real Ray Serve proxies and the router replica's own ports (serving.ingress direct) on every
interface (serving.host 0.0.0.0), and a fuzz campaign of bad requests.

gRPC and HTTPS answer only with a valid token (UNAUTHENTICATED / 401 otherwise, nothing
else), health stays open for probes, plaintext to the TLS port gets nowhere, no listener
outside loopback serves the API in plaintext (Serve's own gRPC port is on loopback), every
fuzzed request (random bytes to every method, health included, invalid UTF-8, NaN,
out-of-vocabulary ids, huge prompts, enum numbers past 32 bits, …) is INVALID_ARGUMENT and
every fuzzed HTTP body a 400 naming its field (float extremes served); afterwards a normal
request still returns the reference output. A router replica killed mid-request: a raw gRPC
client sees UNAVAILABLE, the `openai` client 503 or an error event, never INTERNAL or a cut.
The models run in the router (the worker path has its own tests): this module is about the
public surface.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from actors.app import free_port, start_app
from specdec.config.config import load_config
from specdec_rpc.public.client import SpecdecClient
from specdec_rpc.public.proxy_binding import is_loopback
from specdec_rpc.public.public_service import SERVICE_NAME
from specdec.wiring.engine_builder import build_served_engine
from specdec_rpc.v1 import specdec_pb2, specdec_pb2_grpc
from ray_processes import actor_pids, listening_sockets

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "scripts"))
import fuzz  # noqa: E402
import fuzz_http  # noqa: E402

TOKEN = "operator-token-1"
MAX_SEQ_LEN = 256


@pytest.fixture(scope="module")
def app(tls_files, tmp_path_factory):
    cert, key = tls_files
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(f"# the team's tokens\n{TOKEN}\n")
    config = load_config(overrides={
        "cache": {"num_slots": 6, "max_seq_len": MAX_SEQ_LEN},
        "serving": {"port": free_port(), "http_port": free_port(), "host": "0.0.0.0", "ingress": "direct",
                    "direct_port": free_port(), "direct_http_port": free_port()},
        "security": {"tls_cert_file": str(cert), "tls_key_file": str(key), "api_tokens_file": str(tokens)},
    })
    app = start_app(config, backend_factory=functools.partial(build_served_engine, config),
                    ray_init_kwargs={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
    yield app
    app.shutdown()


def client(app, tls_files, token=TOKEN) -> SpecdecClient:
    return SpecdecClient(app.address, timeout_s=60.0, retries=0, token=token, tls_ca_file=str(tls_files[0]))


def test_grpc_over_tls_serves_a_valid_token_and_refuses_others(app, tls_files, tokenizer, hf_greedy):
    prompt = tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    with client(app, tls_files) as good:
        assert list(good.generate(prompt_token_ids=prompt, max_new_tokens=8).token_ids) == hf_greedy(prompt, 8)
        assert good.stats().rounds > 0
    for token in (None, "operator-token-2", TOKEN[:-1]):
        with client(app, tls_files, token=token) as bad:
            for call in (lambda: bad.generate("x", max_new_tokens=2), lambda: list(bad.generate_stream("x")),
                         bad.stats):
                with pytest.raises(grpc.RpcError) as error:
                    call()
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert TOKEN not in error.value.details()
            assert bad.health() == "SERVING"  # probes need no token (security.open_health)


def test_the_router_replicas_own_ports_serve_over_tls_with_a_valid_token_only(app, tls_files, tokenizer, hf_greedy):
    """serving.ingress direct: the replica's own gRPC port streams the greedy tokens (reached
    through the client's list form, which skips an address that does not answer), refuses a
    missing or wrong token and plaintext; its own HTTPS port checks tokens too."""
    [direct], [direct_http] = app.direct_addresses, app.direct_http_urls
    assert direct != app.address and direct_http.startswith("https://")
    prompt = tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    with SpecdecClient(f"127.0.0.1:{free_port()},{direct}", timeout_s=60.0, retries=0, token=TOKEN,
                       tls_ca_file=str(tls_files[0])) as good:
        tokens = [t for chunk in good.generate_stream(prompt_token_ids=prompt, max_new_tokens=8)
                  for t in chunk.token_ids]
        assert tokens == hf_greedy(prompt, 8)
    for token in (None, "operator-token-2"):
        with SpecdecClient(direct, timeout_s=60.0, retries=0, token=token, tls_ca_file=str(tls_files[0])) as bad:
            for call in (lambda: bad.generate("x", max_new_tokens=2), lambda: list(bad.generate_stream("x"))):
                with pytest.raises(grpc.RpcError) as error:
                    call()
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with SpecdecClient(direct, timeout_s=5.0, retries=0, token=TOKEN) as plaintext:
        with pytest.raises(grpc.RpcError) as error:
            plaintext.generate("x", max_new_tokens=2)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    context = ssl.create_default_context(cafile=str(tls_files[0]))
    for token, status in ((TOKEN, 200), ("operator-token-2", 401)):
        request = urllib.request.Request(f"{direct_http}/v1/models", headers={"authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30.0, context=context) as response:
                assert response.status == status
        except urllib.error.HTTPError as exc:
            assert exc.code == status


def test_plaintext_to_the_tls_port_gets_nowhere(app):
    with SpecdecClient(app.address, timeout_s=5.0, retries=0, token=TOKEN) as plaintext:
        with pytest.raises(grpc.RpcError) as error:
            plaintext.generate("x", max_new_tokens=2)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_https_serves_a_valid_token_and_refuses_others(app, tls_files):
    assert app.http_url.startswith("https://")
    ca = str(tls_files[0])
    with openai.OpenAI(base_url=f"{app.http_url}/v1", api_key=TOKEN, max_retries=0,
                       http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca))) as good:
        assert good.completions.create(model="bundled:target", prompt="def f():", max_tokens=4, temperature=0).choices
    with openai.OpenAI(base_url=f"{app.http_url}/v1", api_key="nope", max_retries=0,
                       http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca))) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    with urllib.request.urlopen(f"{app.http_url}/health", context=ssl.create_default_context(cafile=ca)) as health:
        assert health.status == 200  # open for probes
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(app.http_url.replace("https://", "http://") + "/health", timeout=5.0)


def test_a_fuzz_campaign_of_bad_requests_is_all_invalid_argument_and_harms_nobody(app, tls_files, tokenizer,
                                                                                   hf_greedy):
    outcomes = fuzz.run_campaign(app.address, count=150, seed=7, max_seq_len=MAX_SEQ_LEN, timeout_s=30.0,
                                 token=TOKEN, tls_ca_file=str(tls_files[0]))
    assert sum(sum(c.values()) for c in outcomes.values()) == 150 and len({n.split()[0] for n in outcomes}) == 15
    assert fuzz.unexpected(outcomes) == {}, fuzz.table(outcomes)
    bodies = fuzz_http.run_campaign(app.http_url, count=65, seed=7, timeout_s=30.0, token=TOKEN,
                                    tls_ca_file=str(tls_files[0]))
    assert fuzz_http.unexpected(bodies) == {}, fuzz.table(bodies)
    prompt = tokenizer("import os\n", add_special_tokens=False)["input_ids"]
    with client(app, tls_files) as good:
        assert list(good.generate(prompt_token_ids=prompt, max_new_tokens=12).token_ids) == hf_greedy(prompt, 12)


def test_corrupt_bytes_to_every_method_of_both_services_are_invalid_argument(app, tls_files):
    """Health included (it used to answer UNKNOWN, and List / Watch INTERNAL); a valid List
    reports both services, a valid Watch is UNIMPLEMENTED (probes use Check)."""
    from grpc_health.v1 import health_pb2

    from specdec_rpc.public.client import open_channel

    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with open_channel(app.address, str(tls_files[0])) as channel:
        for method in fuzz.SERVICES:
            call = channel.unary_stream(method) if method in fuzz.STREAMING else channel.unary_unary(method)
            with pytest.raises(grpc.RpcError) as error:
                list(call(b"\x0a\x05ab\xff", timeout=30.0, metadata=metadata))
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        listed = health_pb2.HealthListResponse.FromString(channel.unary_unary("/grpc.health.v1.Health/List")(
            b"", timeout=30.0, metadata=metadata))
        assert {name: s.status for name, s in listed.statuses.items()} == {
            "": health_pb2.HealthCheckResponse.SERVING,
            "specdec.v1.SpeculativeDecoding": health_pb2.HealthCheckResponse.SERVING}
        with pytest.raises(grpc.RpcError) as error:
            list(channel.unary_stream(fuzz.HEALTH_WATCH)(b"", timeout=30.0, metadata=metadata))
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_client_cli_takes_a_token_and_a_ca(app, tls_files, capsys):
    from specdec_cli.serve_cli import main

    base = ["client", "generate", "--server", app.address, "--tls-ca", str(tls_files[0]), "--prompt", "def f():",
            "--max-new-tokens", "3", "--json"]
    assert main([*base, "--token", TOKEN]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"]
    assert main(base) != 0
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_a_tokens_file_emptied_cut_short_or_deleted_while_serving_never_turns_authentication_off(app, tls_files):
    """The issue's `: > tokens`: each damage is seen by the router within a second, and over
    the following rechecks no call without a valid token gets through, on either protocol;
    the valid token keeps working, and the restored file is taken again."""
    path = Path(app.config.security.api_tokens_file)
    original = path.read_text()
    https = ssl.create_default_context(cafile=str(tls_files[0]))
    try:
        for damage in (lambda: path.write_text(""), lambda: path.write_text(TOKEN[:8]), path.unlink):
            damage()
            for _ in range(3):  # past the router's recheck (1 s) and the settling of a change
                time.sleep(1.1)
                with client(app, tls_files, token=None) as anonymous, client(app, tls_files, TOKEN[:8]) as cut:
                    for bad in (anonymous, cut):
                        with pytest.raises(grpc.RpcError) as error:
                            bad.generate("x", max_new_tokens=2)
                        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(f"{app.http_url}/v1/models", context=https, timeout=30)
                assert refused.value.code == 401
            with client(app, tls_files) as good:
                assert good.generate("x", max_new_tokens=2).token_ids
            path.write_text(original)
    finally:
        path.write_text(original)


def plaintext_answers(port: int) -> list[str]:
    """What a plaintext client gets from 127.0.0.1:port that it should not: the API's health
    (Ray's own RPC servers answer the standard check for "", their own health, and no other
    service), generation with a valid token, or an HTTP response."""
    answers = []
    api_health = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        calls = {"health": lambda: health_pb2_grpc.HealthStub(channel).Check(api_health, timeout=5),
                 "generate": lambda: specdec_pb2_grpc.SpeculativeDecodingStub(channel).Generate(
                     specdec_pb2.GenerateRequest(prompt="x", max_new_tokens=1), timeout=5,
                     metadata=[("authorization", f"Bearer {TOKEN}")])}
        for name, call in calls.items():
            try:
                answers.append(f"gRPC {name}: {call()}")
            except grpc.RpcError:
                pass
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5.0) as response:
            answers.append(f"HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        answers.append(f"HTTP {exc.code}")
    except (OSError, http.client.HTTPException):  # refused, reset, or not HTTP/1 (a gRPC server's frames)
        pass
    return answers


def speaks_tls(port: int, ca: str) -> bool:
    context = ssl.create_default_context(cafile=ca)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5.0) as raw:
            with context.wrap_socket(raw, server_hostname="localhost"):
                return True
    except (ssl.SSLError, OSError):
        return False


@pytest.mark.slow
def test_no_listener_outside_loopback_answers_in_plaintext(app, tls_files):
    """A scan of the listening sockets of Serve's proxy and the router replicas: the public
    ports (the proxies' and the replica's own) are on the network and speak TLS; every other
    non-loopback one (Ray's own RPC ports, which Ray authenticates itself) serves neither the
    API nor HTTP in plaintext;
    Serve's plaintext gRPC port (start-up probes) answers on loopback only."""
    sockets = listening_sockets(actor_pids("ProxyActor") + actor_pids(":SpecdecRouter"))
    public = {int(address.rsplit(":", 1)[1]) for address in (app.address, app.http_url, *app.direct_addresses,
                                                              *app.direct_http_urls)}
    exposed = {port for ip, port in sockets if not is_loopback(f"{ip}:{port}")}
    assert public <= exposed, sockets
    for port in public:
        assert speaks_tls(port, str(tls_files[0])), port
    leaks = {port: plaintext_answers(port) for port in exposed}
    assert {port: answers for port, answers in leaks.items() if answers} == {}
    internal = {port for ip, port in sockets if is_loopback(f"{ip}:{port}") and plaintext_answers(port)}
    assert len(internal) == 1 and not internal & exposed, sockets  # Serve's own gRPC port, loopback only


MAX_NEW = 200


def kill_the_router_replica_mid_request(app, tls_files) -> dict[str, str]:
    """Two raw gRPC streams, a raw unary call, an `openai` stream and an `openai` completion in
    flight; SIGKILL of the router replica once the streams have their first tokens. Returns
    how each ended ("ok" when it finished before the kill)."""
    ca = str(tls_files[0])
    metadata = [("authorization", f"Bearer {TOKEN}")]
    channel = grpc.secure_channel(app.address, grpc.ssl_channel_credentials(tls_files[0].read_bytes()))
    stub = specdec_pb2_grpc.SpeculativeDecodingStub(channel)
    request = specdec_pb2.GenerateRequest(prompt="class Stack:", max_new_tokens=MAX_NEW,
                                          sampling=specdec_pb2.SamplingParams(temperature=0))
    http = openai.OpenAI(base_url=f"{app.http_url}/v1", api_key=TOKEN, max_retries=0,
                         http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca)))
    outcomes: dict[str, str] = {}

    def outcome(name, call):
        try:
            call()
            outcomes[name] = "ok"
        except grpc.RpcError as exc:
            outcomes[name] = exc.code().name
        except openai.APIStatusError as exc:
            outcomes[name] = f"HTTP {exc.status_code}"
        except openai.APIError as exc:  # an error event in the stream (not a connection error)
            outcomes[name] = f"{type(exc).__name__}: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - a cut stream, whatever the library makes of it
            outcomes[name] = f"{type(exc).__name__}: {exc}"

    credentials = grpc.ssl_channel_credentials(tls_files[0].read_bytes())
    direct_channel = grpc.secure_channel(app.direct_addresses[0], credentials)
    direct_stub = specdec_pb2_grpc.SpeculativeDecodingStub(direct_channel)
    streams = [stub.GenerateStream(request, metadata=metadata, timeout=120) for _ in range(2)]
    streams.append(direct_stub.GenerateStream(request, metadata=metadata, timeout=120))  # the replica's own port
    for stream in streams:
        next(stream)
    http_stream = http.completions.create(model="bundled:target", prompt="class Stack:", max_tokens=MAX_NEW,
                                          temperature=0, stream=True)
    next(iter(http_stream))
    calls = {"grpc unary": lambda: stub.Generate(request, metadata=metadata, timeout=120),
             "openai completion": lambda: http.completions.create(model="bundled:target", prompt="class Stack:",
                                                                  max_tokens=MAX_NEW, temperature=0),
             "grpc stream 0": lambda: list(streams[0]), "grpc stream 1": lambda: list(streams[1]),
             "grpc direct stream": lambda: list(streams[2]),
             "openai stream": lambda: list(http_stream)}
    threads = [threading.Thread(target=outcome, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the unary calls reach the replica
    [pid] = actor_pids(":SpecdecRouter")
    os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=120)
    channel.close()
    direct_channel.close()
    http.close()
    return outcomes


@pytest.mark.slow
def test_a_killed_router_replica_is_unavailable_to_every_client(app, tls_files):
    """(Last in this module: the replica Serve starts in place of the killed one serves afterwards.)"""
    outcomes = kill_the_router_replica_mid_request(app, tls_files)
    event = "APIError: the router replica serving this request died"  # the stream's error event
    if outcomes.get("openai stream", "").startswith(event):
        outcomes["openai stream"] = event
    assert outcomes == {"grpc unary": "UNAVAILABLE", "grpc stream 0": "UNAVAILABLE", "grpc stream 1": "UNAVAILABLE",
                        "grpc direct stream": "UNAVAILABLE",  # through the replica's own port
                        "openai completion": "HTTP 503", "openai stream": event}  # all in flight, none "ok"
    deadline = time.monotonic() + 60.0
    with client(app, tls_files) as good:  # the replacement serves
        while True:
            try:
                if good.health() == "SERVING":
                    break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            assert time.monotonic() < deadline, "no replica serves again"
            time.sleep(0.5)
