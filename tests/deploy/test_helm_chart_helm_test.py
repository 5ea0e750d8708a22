"""The chart's `helm test` pod, read as a specification: it calls the gRPC API through the
Service, sends the API token when auth is on and trusts the TLS Secret's CA when TLS is on, and
its scripts really run (against a local TLS server with a token, and the HTTP check)."""

from __future__ import annotations

from typing import Any

import pytest

from chart_views import RAYCLUSTER_CRD, VALUES
from deploy_helpers import crd_schema, schema_errors, strip_source, sub_schema  # noqa: E501  registered by conftest.py



TOKENS_FILE = "/etc/specdec/api-tokens/tokens"
TEST_CA_FILE = "/etc/specdec/tls/ca.crt"


def _grpc_test(pod) -> tuple[str, list[str]]:
    """The helm test's gRPC container: (its shell script, the client arguments it passes on)."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "grpc-api")
    shell, flags, script, name, *args = container["command"]
    assert (shell, flags, name) == ("sh", "-ec", "helm-test")
    return script, args


def _test_volumes(pod) -> dict[str, dict[str, Any]]:
    """{volume name: (secret name, {key: path}, mount path, read-only)} of the gRPC container."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "grpc-api")
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    out = {}
    for volume in pod["spec"].get("volumes", []):
        secret = volume["secret"]
        mount = mounts[volume["name"]]
        out[volume["name"]] = (secret["secretName"], {i["key"]: i["path"] for i in secret["items"]},
                               mount["mountPath"], mount.get("readOnly"))
    assert set(mounts) == set(out)
    return out


def test_helm_test_pod_should_call_the_grpc_api_through_the_service(rendered, crds):
    pod = strip_source(rendered.one("Pod"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script, args = _grpc_test(pod)
    assert args == ["--server", f"specdec:{VALUES['service']['port']}"]  # no TLS by default
    assert [line for line in script.splitlines() if line.startswith("specdec ")] == [
        'specdec client health "$@"', 'specdec status "$@"']
    http = pod["spec"]["containers"][1]
    assert http["command"][-1] == f"http://specdec:{VALUES['service']['httpPort']}/health"
    assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in pod["spec"]["containers"])
    pod_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec")
    assert schema_errors(pod["spec"], pod_spec_schema) == []


def test_helm_test_should_send_the_token_when_auth_is_on_and_not_when_off(rendered, render):
    pod = strip_source(rendered.one("Pod"))  # auth is on by default, with the generated token
    script, args = _grpc_test(pod)
    assert f"{TOKENS_FILE} | grep -m1 ." in script and "export SPECDEC_API_TOKEN" in script
    assert "--token" not in args  # the token never appears in argv
    assert _test_volumes(pod) == {
        "api-tokens": ("specdec-api-tokens", {"tokens": "tokens"}, "/etc/specdec/api-tokens", True)}
    secret_name = rendered.one("Secret", "-api-tokens")["metadata"]["name"]
    assert pod["spec"]["volumes"][0]["secret"]["secretName"] == secret_name
    existing = strip_source(render((), **{"security.auth.existingSecret": "team-tokens",
                                          "security.auth.secretKey": "list"}).one("Pod"))
    assert _test_volumes(existing)["api-tokens"][:2] == ("team-tokens", {"list": "tokens"})
    off = strip_source(render((), **{"security.auth.enabled": False}).one("Pod"))
    script, args = _grpc_test(off)
    assert "SPECDEC_API_TOKEN" not in script and "api-tokens" not in script
    assert _test_volumes(off) == {} and "volumes" not in off["spec"]
    assert args == ["--server", f"specdec:{VALUES['service']['port']}"]


def test_helm_test_should_trust_the_tls_secrets_ca_when_tls_is_on(render, crds):
    pod = strip_source(render((), **{"security.tls.existingSecret": "cert"}).one("Pod"))
    script, args = _grpc_test(pod)
    assert args == ["--server", f"specdec:{VALUES['service']['port']}", "--tls-ca", TEST_CA_FILE]
    volumes = _test_volumes(pod)
    # only the CA (here: the certificate chain) is mounted, never the private key
    assert volumes["api-tls-ca"] == ("cert", {"tls.crt": "ca.crt"}, "/etc/specdec/tls", True)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["grpc-api", "http-health"]
    cert_manager = strip_source(render((), **{"security.tls.existingSecret": "cert", "security.tls.caKey": "ca.crt",
                                              "security.auth.enabled": False}).one("Pod"))
    assert _test_volumes(cert_manager) == {"api-tls-ca": ("cert", {"ca.crt": "ca.crt"}, "/etc/specdec/tls", True)}
    assert _grpc_test(cert_manager)[1][-2:] == ["--tls-ca", TEST_CA_FILE]
    no_http = strip_source(render((), **{"security.tls.existingSecret": "cert", "service.httpPort": None}).one("Pod"))
    assert [c["name"] for c in no_http["spec"]["containers"]] == ["grpc-api"]
    pod_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec")
    assert schema_errors(pod["spec"], pod_spec_schema) == []
    assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in pod["spec"]["containers"])


def _token_server(cert, key, token: str):
    """A TLS gRPC server on localhost: health (open) and GetStats (needs `token`); returns
    (server, port, the authorization values GetStats saw)."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    from specdec_rpc.v1 import specdec_pb2, specdec_pb2_grpc

    seen = []

    class Api(specdec_pb2_grpc.SpeculativeDecodingServicer):
        def GetStats(self, request, context):  # noqa: N802
            authorization = dict(context.invocation_metadata()).get("authorization")
            seen.append(authorization)
            if authorization != f"Bearer {token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid_api_key")
            return specdec_pb2.GetStatsResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    specdec_pb2_grpc.add_SpeculativeDecodingServicer_to_server(Api(), server)
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    port = server.add_secure_port("localhost:0", credentials)
    server.start()
    return server, port, seen


@pytest.mark.parametrize("tokens_file, ok", [
    ("# the team's tokens\n\n   tok-first   # ci\ntok-second\n", True),
    ("tok-first", True),  # the generated Secret: one token, no newline
    ("tok-stale\ntok-first\n", False),  # only the first token is sent
])
def test_helm_test_grpc_script_should_reach_a_tls_server_with_the_token(render, tls_files, tmp_path, tokens_file, ok):
    """The rendered script, run here with the real `specdec` CLI against a TLS server that wants a
    token; the mounted paths and the Service's host:port point at local files and the server."""
    import os
    import shutil
    import subprocess

    if shutil.which("specdec") is None:
        pytest.skip("the specdec CLI is not installed")
    cert, key = tls_files
    pod = strip_source(render((), **{"security.tls.existingSecret": "cert"}).one("Pod"))
    script, args = _grpc_test(pod)
    (tmp_path / "tokens").write_text(tokens_file)
    script = script.replace(TOKENS_FILE, str(tmp_path / "tokens"))
    server, port, seen = _token_server(cert, key, "tok-first")
    try:
        args = [{f"specdec:{VALUES['service']['port']}": f"localhost:{port}", TEST_CA_FILE: str(cert)}.get(a, a)
                for a in args]
        env = {k: v for k, v in os.environ.items() if k != "SPECDEC_API_TOKEN"}
        proc = subprocess.run(["sh", "-ec", script, "helm-test", *args], capture_output=True, text=True,
                              timeout=120, env=env)
    finally:
        server.stop(None)
    assert proc.stdout.splitlines()[0] == "SERVING", (proc.stdout, proc.stderr)
    if ok:
        assert proc.returncode == 0 and seen == ["Bearer tok-first"], (proc.stdout, proc.stderr)
    else:
        assert proc.returncode != 0 and "UNAUTHENTICATED" in proc.stderr and seen == ["Bearer tok-stale"]


def test_helm_test_http_check_should_run_the_command_it_renders(render, tmp_path):
    """The HTTP check's python one-liner, run against a local server answering /health."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            body = b'{"status": "serving"}' if self.path == "/health" else b"{}"
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        command = strip_source(render().one("Pod"))["spec"]["containers"][1]["command"]
        url = command[-1].replace(f"specdec:{VALUES['service']['httpPort']}", f"127.0.0.1:{server.server_address[1]}")
        proc = subprocess.run([sys.executable, *command[1:-1], url], capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert proc.returncode == 0 and proc.stdout.startswith("200"), proc.stderr
