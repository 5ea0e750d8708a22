"""The Helm chart with `specdec.config.serving.ingress: direct` (the router replicas' own ports):
every Ray container starts with Serve's direct ingress environment exactly as `specdec serve`
gives it for the same config, so the app builder (actors.app:build_app, run in a Ray process)
accepts the rendered args there; the Ray pods' NetworkPolicy admits the replicas' port ranges
from the API's clients; a headless Service names the head pod, where the replicas run.
Without it, none of this renders."""

from __future__ import annotations

import pytest

import chart_views as view
from chart_views import RAYSERVICE_CRD
from deploy_helpers import crd_schema, schema_errors, strip_source  # noqa: E501  registered by conftest.py

SERVING = {"ingress": "direct", "router_replicas": 2, "direct_port": 41000}


@pytest.fixture
def direct(render):
    return render((), **{"specdec__config": {"serving": SERVING}, "networkPolicy__apiFrom": [
        {"namespaceSelector": {"matchLabels": {"team": "clients"}}}]})


def serving_config(docs):
    from specdec.config.config import load_config

    return load_config(overrides=view.serve_config(docs)["applications"][0]["args"])


def test_every_ray_container_starts_with_the_direct_environment_specdec_serve_gives(direct):
    from actors.serve_endpoints import DIRECT_NAMES, direct_environment

    expected = direct_environment(serving_config(direct).serving)
    assert expected["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"] == "41008"  # four ports per replica
    assert expected["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == "30000"  # the schema's default
    for template in view.ray_pod_templates(direct):
        env = view.env(view.container(template))
        assert {name: env[name] for name in DIRECT_NAMES} == expected


def test_the_rayservice_stays_valid_against_the_kuberay_crd(direct, crds):
    assert schema_errors(view.rayservice(direct), crd_schema(RAYSERVICE_CRD)) == []


def test_the_builder_takes_direct_ingress_in_the_environment_the_chart_gives(direct, monkeypatch):
    from actors.app import build_app
    from actors.serve_endpoints import DIRECT_NAMES

    args = view.serve_config(direct)["applications"][0]["args"]
    env = view.env(view.container(view.head(direct)["template"]))
    for name in DIRECT_NAMES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RAY_SERVE_ENABLE_DIRECT_INGRESS"):
        build_app(args)  # a Ray started without it
    for name in DIRECT_NAMES:
        monkeypatch.setenv(name, env[name])
    assert build_app(args) is not None


def test_the_network_policy_admits_the_replicas_port_ranges_from_the_apis_clients(direct):
    rules = strip_source(direct.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    [rule] = [r for r in rules if any(p.get("endPort") for p in r.get("ports", []))]
    assert rule["ports"] == [{"port": 41000, "endPort": 41007, "protocol": "TCP"},
                             {"port": 30000, "endPort": 30007, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"team": "clients"}}}]


def test_a_headless_service_names_the_head_where_the_replicas_run(direct):
    service = strip_source(direct.one("Service", "-direct"))["spec"]
    assert service["clusterIP"] == "None"
    head, *workers = view.ray_pod_templates(direct)
    assert view.selects(service["selector"], head["metadata"]["labels"])
    assert workers and not any(view.selects(service["selector"], t["metadata"]["labels"]) for t in workers)
    assert [(p["name"], p["port"]) for p in service["ports"]] == [("grpc-direct", 41000), ("http-direct", 30000)]


def test_without_direct_ingress_none_of_it_renders(rendered):
    from actors.serve_endpoints import DIRECT_NAMES

    for template in view.ray_pod_templates(rendered):
        assert not set(DIRECT_NAMES) & set(view.env(view.container(template)))
    assert not [d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"].endswith("-direct")]
    rules = strip_source(rendered.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    assert not any(p.get("endPort") for r in rules for p in r.get("ports", []))
