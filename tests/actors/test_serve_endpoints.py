"""The proxies' options from the config: `serving.host` is the bind address of both protocols,
TLS moves Serve's plaintext gRPC port to loopback, and the proxy's start-up hook is always in
the environment Ray passes on."""

import os

import pytest

from actors.app import build_app
from actors.serve_endpoints import DIRECT_NAMES, direct_environment, export_environment, serve_endpoints
from specdec.config.config import load_config


def config(host="0.0.0.0", tls_files=None, **serving):
    security = {"tls_cert_file": str(tls_files[0]), "tls_key_file": str(tls_files[1])} if tls_files else {}
    return load_config(overrides={"serving": {"host": host, "port": 50051, "http_port": 8000, **serving},
                                  "security": security})


def test_without_tls_both_public_ports_bind_the_host_in_plaintext():
    endpoints = serve_endpoints(config("10.1.2.3"))
    assert (endpoints.http.host, endpoints.grpc.port) == ("10.1.2.3", 50051)
    assert endpoints.environment["SPECDEC_BIND_HOST"] == "10.1.2.3"
    assert endpoints.environment["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "actors.serve_proxy.setup_proxy"
    assert endpoints.public_address == endpoints.probe_address == "10.1.2.3:50051"
    assert endpoints.http_url == "http://10.1.2.3:8000" and not endpoints.tls
    assert (endpoints.grpc.grpc_servicer_functions[0] ==
            "specdec_rpc.public.replica_loss.report_replica_loss_as_unavailable")


def test_with_tls_serves_plaintext_grpc_port_is_internal_on_loopback(tls_files):
    endpoints = serve_endpoints(config("0.0.0.0", tls_files), internal_grpc_port=50999)
    assert endpoints.tls and endpoints.environment["SPECDEC_TLS_PORT"] == "50051"
    assert endpoints.grpc.port == 50999 and endpoints.probe_address == "127.0.0.1:50999"
    assert endpoints.public_address == "127.0.0.1:50051" and endpoints.http_url == "https://127.0.0.1:8000"
    assert endpoints.http.ssl_certfile == str(tls_files[0])


def test_joining_a_ray_without_the_hook_is_refused_with_tls(tls_files, monkeypatch):
    for name in ("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "SPECDEC_BIND_HOST", "SPECDEC_TLS_PORT",
                 "SPECDEC_TLS_CERT_FILE", "SPECDEC_TLS_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)  # restored (unset) afterwards
    with pytest.raises(ValueError, match="start Ray with them set"):
        export_environment(serve_endpoints(config("0.0.0.0", tls_files)), ray_started_here=False)
    export_environment(serve_endpoints(config("0.0.0.0")), ray_started_here=False)  # logged only
    export_environment(serve_endpoints(config("0.0.0.0", tls_files)), ray_started_here=True)
    assert os.environ["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "actors.serve_proxy.setup_proxy"
    export_environment(serve_endpoints(config("127.0.0.1")), ray_started_here=True)
    assert "SPECDEC_TLS_PORT" not in os.environ and os.environ["SPECDEC_BIND_HOST"] == "127.0.0.1"


def test_direct_ingress_gives_ray_serve_the_replicas_port_ranges_and_only_when_asked():
    endpoints = serve_endpoints(config(ingress="direct", router_replicas=2, direct_port=41000, direct_http_port=31000))
    env = endpoints.environment
    assert endpoints.direct and env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"]) == (
        "41000", "41008")  # four ports per replica (Serve's upper bound is exclusive)
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "31000", "31008")
    assert env["SPECDEC_BIND_HOST"] == "0.0.0.0"  # the replicas' ports bind serving.host as the proxies'
    assert not serve_endpoints(config()).direct and not set(DIRECT_NAMES) & set(serve_endpoints(config()).environment)


def test_joining_a_ray_without_direct_ingress_is_refused_and_a_proxy_app_leaves_none_behind(monkeypatch):
    for name in DIRECT_NAMES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="serving.ingress direct"):
        export_environment(serve_endpoints(config(ingress="direct")), ray_started_here=False)
    export_environment(serve_endpoints(config(ingress="direct")), ray_started_here=True)
    assert os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    export_environment(serve_endpoints(config()), ray_started_here=True)  # the next Ray of this process
    assert not set(DIRECT_NAMES) & set(os.environ)


def test_a_serve_deployment_of_the_builder_takes_direct_ingress_only_from_a_ray_started_for_it(monkeypatch):
    """The builder runs in a Ray process: Ray's environment must hold the config's direct ingress
    (the Helm chart sets it on the Ray containers; tests/deploy/test_helm_chart_direct.py)."""
    for name in DIRECT_NAMES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RAY_SERVE_ENABLE_DIRECT_INGRESS.*use ingress proxy"):
        build_app({"serving": {"ingress": "direct"}})
    for name, value in direct_environment(config(ingress="direct").serving).items():
        monkeypatch.setenv(name, value)
    assert build_app({"serving": {"ingress": "direct"}}) is not None
    with pytest.raises(ValueError, match="RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"):  # Ray's ranges are another's
        build_app({"serving": {"ingress": "direct", "router_replicas": 2}})
