"""The public API as an operator deploys it: TLS and bearer tokens on both protocols through
real Ray Serve proxies on 127.0.0.1, and a fuzz campaign of bad requests.

gRPC and HTTPS answer only with a valid token (UNAUTHENTICATED / 401 otherwise, nothing
else), health stays open for probes, plaintext to the TLS port gets nowhere, and every
fuzzed request (random bytes to every method, health included, invalid UTF-8, NaN,
out-of-vocabulary ids, huge prompts, enum numbers past 32 bits, …) is INVALID_ARGUMENT and
every fuzzed HTTP body a 400 naming its field (float extremes served); afterwards a normal request still returns the reference output. The
models run in the router (the worker path has its own tests): this module is about the
public surface.
"""

from __future__ import annotations

import functools
import json
import sys

import ssl
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from actors.app import free_port, start_app
from specdec.config import load_config
from specdec_rpc.client import SpecdecClient
from specdec_rpc.router_backend import local_backend

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
        "cache": {"num_slots": 4, "max_seq_len": MAX_SEQ_LEN},
        "serving": {"port": free_port(), "http_port": free_port(), "host": "127.0.0.1"},
        "security": {"tls_cert_file": str(cert), "tls_key_file": str(key), "api_tokens_file": str(tokens)},
    })
    app = start_app(config, backend_factory=functools.partial(local_backend, config),
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

    from specdec_rpc.client import open_channel

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
            "": health_pb2.HealthCheckResponse.SERVING, "specdec.v1.SpeculativeDecoding": health_pb2.HealthCheckResponse.SERVING}
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
