"""The Helm chart's network and security surface, read as a specification: the gRPC Service and
probes, Redis and its Secret, the ServiceMonitor, NetworkPolicies and pod security contexts
(rendered by the real helm binary; schemas as in test_helm_chart.py)."""

from __future__ import annotations

from typing import Any

import pytest

import chart_views as view
from chart_views import RAYCLUSTER_CRD, RAYSERVICE_CRD, VALUES
from deploy_helpers import HelmError, crd_schema, schema_errors, strip_source, sub_schema  # registered by conftest.py


# --------------------------------------------------------------------------- gRPC Service and probes


def test_should_expose_the_grpc_port_through_a_service_to_the_head_pod(rendered, crds):
    service = strip_source(rendered.one("Service", "specdec"))
    (port,) = service["spec"]["ports"]
    assert port["port"] == VALUES["service"]["port"] and port["targetPort"] == VALUES["grpc"]["port"]
    head = view.head(rendered)["template"]
    selector = dict(service["spec"]["selector"])
    assert selector.pop("ray.io/serve") == "true"  # set by KubeRay on pods whose proxy serves
    assert view.selects(selector, head["metadata"]["labels"])
    assert not any(view.selects(selector, w["template"]["metadata"]["labels"]) for w in view.workers(rendered).values())
    ports = {p["name"]: p["containerPort"] for p in view.container(head)["ports"]}
    assert ports["grpc"] == port["targetPort"]
    assert schema_errors(service, crd_schema(RAYSERVICE_CRD)["properties"]["spec"]["properties"]["serveService"]) == []


def test_grpc_port_should_be_one_value_across_serve_service_probe_and_image(render):
    docs = render((), **{"grpc.port": 9443, "service.port": 443})
    config = view.serve_config(docs)
    head = view.container(view.head(docs)["template"])
    assert config["grpc_options"]["port"] == config["applications"][0]["args"]["serving"]["port"] == 9443
    assert {p["name"]: p["containerPort"] for p in head["ports"]}["grpc"] == 9443
    assert head["livenessProbe"]["grpc"]["port"] == 9443
    assert strip_source(docs.one("Service", "specdec"))["spec"]["ports"][0]["targetPort"] == 9443


def test_head_should_have_a_native_grpc_liveness_probe_and_leave_readiness_to_kuberay(rendered):
    head = view.container(view.head(rendered)["template"])
    assert head["livenessProbe"]["grpc"] == {"port": VALUES["grpc"]["port"]}
    assert head["livenessProbe"]["initialDelaySeconds"] >= 300
    # KubeRay deploys the Serve app only after the head pod is Ready: an app-level readiness
    # probe would never pass, so the chart leaves the head's readiness to KubeRay
    assert "readinessProbe" not in head and "startupProbe" not in head


def test_worker_pods_should_be_ready_when_their_raylet_is_healthy(rendered):
    """KubeRay's default worker readiness also wants a Serve proxy on the pod; specdec's workers
    host model actors and the proxy runs on the head, so the chart checks the raylet instead
    (KubeRay keeps a user-defined httpGet probe)."""
    for name, group in view.workers(rendered).items():
        probe = view.container(group["template"])["readinessProbe"]
        assert probe["httpGet"] == {"path": "/api/local_raylet_healthz", "port": 52365}, name
    assert view.serve_config(rendered)["proxy_location"] == "HeadOnly"


def test_should_fall_back_to_kuberays_worker_probe_when_asked(render):
    docs = render((), **{"rayPods.workerReadinessProbe": None})  # helm deletes a key set to null
    for group in view.workers(docs).values():
        assert "readinessProbe" not in view.container(group["template"])


def test_should_drop_the_grpc_liveness_probe_when_disabled(render):
    head = view.container(view.head(render((), **{"head.livenessProbe.enabled": False}))["template"])
    assert "livenessProbe" not in head


# --------------------------------------------------------------------------- Redis


def test_should_render_a_redis_with_a_password_from_a_secret_by_default(rendered, crds):
    deployment = strip_source(rendered.one("Deployment", "-redis"))
    service = strip_source(rendered.one("Service", "-redis"))
    secret = strip_source(rendered.one("Secret", "-redis"))
    assert secret["data"]["redis-password"]
    container = view.container(deployment["spec"]["template"])
    assert "--requirepass" in container["args"] and "$(REDIS_PASSWORD)" in container["args"]
    assert view.env(container)["REDIS_PASSWORD"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert view.selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert view.selects(service["spec"]["selector"], labels)
    assert not rendered.of_kind("PersistentVolumeClaim")
    assert {"emptyDir": {}} == {k: v for k, v in deployment["spec"]["template"]["spec"]["volumes"][0].items() if k != "name"}
    pod_template_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template")
    assert schema_errors(deployment["spec"]["template"], pod_template_schema) == []
    service_schema = crd_schema(RAYSERVICE_CRD)["properties"]["spec"]["properties"]["serveService"]
    assert schema_errors(service, service_schema) == []


def test_should_keep_a_given_redis_password(render):
    import base64

    secret = strip_source(render((), **{"redis.auth.password": "s3cret"}).one("Secret"))
    assert base64.b64decode(secret["data"]["redis-password"]).decode() == "s3cret"


def test_should_use_an_existing_secret_and_render_none(render):
    docs = render((), **{"redis.auth.existingSecret": "my-redis", "redis.auth.existingSecretPasswordKey": "pw"})
    assert not docs.of_kind("Secret")
    ref = {"secretKeyRef": {"name": "my-redis", "key": "pw"}}
    assert view.env(view.container(docs.one("Deployment", "-redis")["spec"]["template"]))["REDIS_PASSWORD"] == ref
    for template in view.ray_pod_templates(docs):
        assert view.env(view.container(template))["SPECDEC_REDIS_PASSWORD"] == ref


def test_should_render_a_claim_only_when_persistence_is_enabled(render, crds):
    docs = render((), **{"redis.persistence.enabled": True, "redis.persistence.storageClass": "fast"})
    claim = strip_source(docs.one("PersistentVolumeClaim"))
    assert claim["spec"]["storageClassName"] == "fast"
    claim_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec",
                                   "volumes", "[]", "ephemeral", "volumeClaimTemplate", "spec")
    assert schema_errors(claim["spec"], claim_spec_schema) == []
    volume = docs.one("Deployment", "-redis")["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert "--appendonly" in (args := view.container(docs.one("Deployment")["spec"]["template"])["args"])
    assert args[args.index("--appendonly") + 1] == "yes"
    existing = render((), **{"redis.persistence.enabled": True, "redis.persistence.existingClaim": "old"})
    assert not existing.of_kind("PersistentVolumeClaim")
    assert existing.one("Deployment")["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "old"}


def test_should_not_render_redis_when_an_external_url_is_given(render):
    docs = render((), **{"redis.enabled": False, "externalRedis.url": "redis://cache.example:6380/2",
                         "externalRedis.existingSecret": "ext", "metrics.serviceMonitor.enabled": False})
    assert not docs.of_kind("Deployment") and not docs.of_kind("Secret") and not docs.of_kind("PersistentVolumeClaim")
    assert [s["metadata"]["name"] for s in docs.of_kind("Service")] == ["specdec"]
    assert [n["metadata"]["name"] for n in docs.of_kind("NetworkPolicy")] == ["specdec-ray"]
    for template in view.ray_pod_templates(docs):
        env = view.env(view.container(template))
        assert env["SPECDEC_REDIS_URL"] == "redis://cache.example:6380/2"
        assert env["SPECDEC_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "ext", "key": "redis-password"}}


def test_should_store_an_external_redis_password_in_a_secret(render):
    docs = render((), **{"redis.enabled": False, "externalRedis.url": "redis://r:6379/0",
                         "externalRedis.password": "pw"})
    assert strip_source(docs.one("Secret"))["metadata"]["name"] == "specdec-redis"
    without = render((), **{"redis.enabled": False, "externalRedis.url": "redis://r:6379/0"})
    assert not without.of_kind("Secret")
    assert "SPECDEC_REDIS_PASSWORD" not in view.env(view.container(view.head(without)["template"]))


def test_should_refuse_to_render_without_any_redis(render):
    with pytest.raises(HelmError, match="externalRedis.url"):
        render((), **{"redis.enabled": False})


# --------------------------------------------------------------------------- metrics


def test_should_render_a_servicemonitor_only_when_enabled(render):
    assert not render().of_kind("ServiceMonitor")
    docs = render((), **{"metrics.serviceMonitor.enabled": True,
                         "metrics.serviceMonitor.labels": {"release": "prometheus"}})
    monitor = strip_source(docs.one("ServiceMonitor"))
    metrics = strip_source(docs.one("Service", "-metrics"))
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert view.selects(monitor["spec"]["selector"]["matchLabels"], metrics["metadata"]["labels"])
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in metrics["spec"]["ports"]]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    # the metrics Service reaches every Ray pod on the port Ray exports metrics on
    for template in view.ray_pod_templates(docs):
        assert view.selects(metrics["spec"]["selector"], template["metadata"]["labels"])
        ports = {p["name"]: p["containerPort"] for p in view.container(template)["ports"]}
        assert ports["metrics"] == metrics["spec"]["ports"][0]["targetPort"] == VALUES["metrics"]["port"]
    assert view.head(docs)["rayStartParams"]["metrics-export-port"] == str(VALUES["metrics"]["port"])


# --------------------------------------------------------------------------- NetworkPolicies


def _ingress_rule_schema():
    return sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "networkPolicy", "head", "ingressRules", "[]")


def test_should_render_network_policies_when_enabled(rendered, crds):
    ray_policy = strip_source(rendered.one("NetworkPolicy", "-ray"))
    redis_policy = strip_source(rendered.one("NetworkPolicy", "-redis"))
    ray_selector = ray_policy["spec"]["podSelector"]["matchLabels"]
    for template in view.ray_pod_templates(rendered):
        assert view.selects(ray_selector, template["metadata"]["labels"])
    redis_labels = rendered.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
    assert not view.selects(ray_selector, redis_labels)
    assert view.selects(redis_policy["spec"]["podSelector"]["matchLabels"], redis_labels)
    for policy in (ray_policy, redis_policy):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"]["ingress"]:
            assert schema_errors(rule, _ingress_rule_schema()) == []


def test_from_outside_only_the_router_port_should_reach_the_ray_pods(rendered):
    rules = strip_source(rendered.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    open_rules = [r for r in rules if "from" not in r]  # rules that admit any source
    assert open_rules == [{"ports": [{"port": VALUES["grpc"]["port"], "protocol": "TCP"}]}]
    ray_only = [r for r in rules if "ports" not in r]  # rules that admit any port
    assert ray_only == [{"from": [{"podSelector": {"matchLabels": rules[0]["from"][0]["podSelector"]["matchLabels"]}}]}]
    operator = [r for r in rules if r.get("from") and "namespaceSelector" in r["from"][0]]
    assert [p["port"] for p in operator[0]["ports"]] == [8265, VALUES["serve"]["httpPort"], 52365]


def test_redis_should_be_reachable_only_from_the_ray_pods(rendered):
    (rule,) = strip_source(rendered.one("NetworkPolicy", "-redis"))["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    for template in view.ray_pod_templates(rendered):
        assert view.selects(peer["podSelector"]["matchLabels"], template["metadata"]["labels"])
    redis_labels = rendered.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
    assert not view.selects(peer["podSelector"]["matchLabels"], redis_labels)


def test_should_restrict_grpc_clients_and_admit_prometheus_when_asked(render, crds):
    clients = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}]
    docs = render((), **{"networkPolicy.grpcFrom": clients, "metrics.serviceMonitor.enabled": True})
    rules = strip_source(docs.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    grpc = [r for r in rules if r.get("ports") == [{"port": VALUES["grpc"]["port"], "protocol": "TCP"}]]
    assert grpc == [{"ports": grpc[0]["ports"], "from": clients}]
    assert any(r.get("ports") == [{"port": VALUES["metrics"]["port"], "protocol": "TCP"}] for r in rules)
    for rule in rules:
        assert schema_errors(rule, _ingress_rule_schema()) == []


def test_should_render_no_network_policy_when_disabled(render):
    assert not render((), **{"networkPolicy.enabled": False}).of_kind("NetworkPolicy")


# --------------------------------------------------------------------------- security


def _pod_specs(docs) -> list[tuple[str, dict[str, Any]]]:
    specs = [(f"ray:{t['metadata']['labels']['app.kubernetes.io/component']}", t["spec"]) for t in view.ray_pod_templates(docs)]
    specs += [(f"deployment:{d['metadata']['name']}", d["spec"]["template"]["spec"]) for d in docs.of_kind("Deployment")]
    specs += [(f"pod:{p['metadata']['name']}", p["spec"]) for p in docs.of_kind("Pod")]
    return specs


def test_every_pod_should_run_as_non_root_without_privileges(rendered):
    for name, spec in _pod_specs(rendered):
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] > 0, name
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"]["drop"] == ["ALL"], name
            assert not ctx.get("privileged"), name


def test_helm_test_pod_should_check_grpc_health_through_the_service(rendered, crds):
    pod = strip_source(rendered.one("Pod"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert view.container(pod)["command"] == ["specdec", "client", "health", "--server",
                                          f"specdec:{VALUES['service']['port']}"]
    pod_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec")
    assert schema_errors(pod["spec"], pod_spec_schema) == []
