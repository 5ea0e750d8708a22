"""The Helm chart's network and security surface, read as a specification: the gRPC Service and
probes, the ServiceMonitor, NetworkPolicies and pod security contexts (rendered by the real helm
binary; schemas as in test_helm_chart.py). Redis and its Secret: test_helm_chart_redis.py; the
`helm test` pod: test_helm_chart_helm_test.py."""

from __future__ import annotations

from typing import Any


import chart_views as view
from chart_views import RAYCLUSTER_CRD, RAYSERVICE_CRD, VALUES
from deploy_helpers import crd_schema, schema_errors, strip_source, sub_schema  # noqa: E501  registered by conftest.py


# --------------------------------------------------------------------------- gRPC Service and probes


def test_should_expose_the_grpc_and_http_ports_through_a_service_to_the_head_pod(rendered, crds):
    service = strip_source(rendered.one("Service", "specdec"))
    port, http = service["spec"]["ports"]
    assert port["port"] == VALUES["service"]["port"] and port["targetPort"] == VALUES["grpc"]["port"]
    assert http["name"] == "http" and http["port"] == VALUES["service"]["httpPort"]
    assert http["targetPort"] == VALUES["serve"]["httpPort"] == view.serve_config(rendered)["http_options"]["port"]
    head = view.head(rendered)["template"]
    selector = dict(service["spec"]["selector"])
    assert selector.pop("ray.io/serve") == "true"  # set by KubeRay on pods whose proxy serves
    assert view.selects(selector, head["metadata"]["labels"])
    assert not any(view.selects(selector, w["template"]["metadata"]["labels"]) for w in view.workers(rendered).values())
    ports = {p["name"]: p["containerPort"] for p in view.container(head)["ports"]}
    assert ports["grpc"] == port["targetPort"] and ports["serve"] == http["targetPort"]
    assert schema_errors(service, crd_schema(RAYSERVICE_CRD)["properties"]["spec"]["properties"]["serveService"]) == []


def test_api_ports_should_each_be_one_value_across_serve_service_network_policy_and_pod(render):
    docs = render((), **{"grpc.port": 9443, "service.port": 443, "serve.httpPort": 8443, "service.httpPort": 80})
    config = view.serve_config(docs)
    head = view.container(view.head(docs)["template"])
    serving = config["applications"][0]["args"]["serving"]
    assert config["grpc_options"]["port"] == serving["port"] == 9443
    assert config["http_options"]["port"] == serving["http_port"] == 8443
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["grpc"] == 9443 and ports["serve"] == 8443
    service_ports = strip_source(docs.one("Service", "specdec"))["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in service_ports] == [(443, 9443), (80, 8443)]
    rules = strip_source(docs.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    assert {"ports": [{"port": 9443, "protocol": "TCP"}, {"port": 8443, "protocol": "TCP"}]} in rules


def test_service_http_port_can_be_left_out(render):
    service = strip_source(render((), **{"service.httpPort": None}).one("Service", "specdec"))
    assert [p["name"] for p in service["spec"]["ports"]] == ["grpc"]


def _ray_health_checks(probe):
    command = " ".join(probe["exec"]["command"])
    return command


def test_head_should_start_with_a_startup_probe_and_stay_alive_on_rays_health_not_the_apps(rendered):
    head = view.container(view.head(rendered)["template"])
    startup, liveness = head["startupProbe"], head["livenessProbe"]
    for probe in (startup, liveness):
        command = _ray_health_checks(probe)
        # Ray's own health endpoints (answer without a Ray token), never the API ports: a head
        # whose app is busy is not restarted
        assert "localhost:52365/api/local_raylet_healthz" in command and "localhost:8265/api/gcs_healthz" in command
        assert str(VALUES["grpc"]["port"]) not in command and "grpc" not in probe
        assert "initialDelaySeconds" not in probe  # the startup probe replaces the long delay
        # two requests, each with half the probe's timeout, so the probe's own timeout never cuts one off
        assert command.count(f"wget -T {max(1, probe['timeoutSeconds'] // 2)} ") == 2
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    # generous: a GCS under load must be down for minutes before the head restarts
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 300 and liveness["timeoutSeconds"] >= 5
    # KubeRay deploys the Serve app only after the head pod is Ready: an app-level readiness
    # probe would never pass, so the chart leaves the head's readiness to KubeRay
    assert "readinessProbe" not in head


def test_probes_can_be_disabled(render):
    head = view.container(view.head(render((), **{"head.livenessProbe.enabled": False,
                                                  "head.startupProbe.enabled": False}))["template"])
    assert "livenessProbe" not in head and "startupProbe" not in head


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


def _egress_rule_schema():
    return sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "networkPolicy", "head", "egressRules", "[]")


def _ray_labels(docs):
    return view.head(docs)["template"]["metadata"]["labels"]


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
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        for rule in policy["spec"]["ingress"]:
            assert schema_errors(rule, _ingress_rule_schema()) == []
        for rule in policy["spec"]["egress"]:
            assert schema_errors(rule, _egress_rule_schema()) == []


def test_from_outside_only_the_api_ports_should_reach_the_ray_pods(rendered):
    rules = strip_source(rendered.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    open_rules = [r for r in rules if "from" not in r]  # rules that admit any source
    assert open_rules == [{"ports": [{"port": VALUES["grpc"]["port"], "protocol": "TCP"},
                                     {"port": VALUES["serve"]["httpPort"], "protocol": "TCP"}]}]
    ray_only = [r for r in rules if "ports" not in r]  # rules that admit any port
    assert ray_only == [{"from": [{"podSelector": {"matchLabels": rules[0]["from"][0]["podSelector"]["matchLabels"]}}]}]
    assert view.selects(ray_only[0]["from"][0]["podSelector"]["matchLabels"], _ray_labels(rendered))
    operator = [r for r in rules if r.get("from") and "namespaceSelector" in r["from"][0]]
    assert [p["port"] for p in operator[0]["ports"]] == [8265, VALUES["serve"]["httpPort"], 52365]


def test_ray_pods_should_reach_only_each_other_dns_redis_and_public_https(render):
    for values, https in (((), True), ((view.CI_VALUES,), False)):
        docs = render(values)
        egress = strip_source(docs.one("NetworkPolicy", "-ray"))["spec"]["egress"]
        redis_labels = docs.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
        any_port = [r for r in egress if "ports" not in r]
        assert len(any_port) == 1
        assert view.selects(any_port[0]["to"][0]["podSelector"]["matchLabels"], _ray_labels(docs))
        dns = [r for r in egress if {"port": 53, "protocol": "UDP"} in r.get("ports", [])]
        assert dns and dns[0]["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
        assert dns[0]["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
        redis = [r for r in egress if r.get("ports") == [{"port": 6379, "protocol": "TCP"}]]
        assert len(redis) == 1 and view.selects(redis[0]["to"][0]["podSelector"]["matchLabels"], redis_labels)
        assert all("to" in r for r in egress), "an egress rule without `to` admits every destination"
        public = [r for r in egress if r.get("ports") == [{"port": 443, "protocol": "TCP"}]]
        if https:  # model downloads: public addresses only, no private (in-cluster) ones
            (rule,) = public
            (block,) = rule["to"]
            assert block["ipBlock"]["cidr"] == "0.0.0.0/0" and "10.0.0.0/8" in block["ipBlock"]["except"]
        else:
            assert not public and len(egress) == 3


def test_redis_should_reach_only_dns(rendered):
    egress = strip_source(rendered.one("NetworkPolicy", "-redis"))["spec"]["egress"]
    assert [p["port"] for r in egress for p in r["ports"]] == [53, 53]


def test_egress_restriction_can_be_turned_off(render):
    docs = render((), **{"networkPolicy.egress.enabled": False})
    for policy in docs.of_kind("NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]


def test_redis_should_be_reachable_only_from_the_ray_pods(rendered):
    (rule,) = strip_source(rendered.one("NetworkPolicy", "-redis"))["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    (ray_peer,) = rule["from"]
    assert set(ray_peer) == {"podSelector"}
    for template in view.ray_pod_templates(rendered):
        assert view.selects(ray_peer["podSelector"]["matchLabels"], template["metadata"]["labels"])
    redis_labels = rendered.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
    assert not view.selects(ray_peer["podSelector"]["matchLabels"], redis_labels)


def test_should_restrict_api_clients_and_admit_prometheus_when_asked(render, crds):
    clients = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}]
    docs = render((), **{"networkPolicy.apiFrom": clients, "metrics.serviceMonitor.enabled": True})
    rules = strip_source(docs.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
    api_ports = [{"port": VALUES["grpc"]["port"], "protocol": "TCP"},
                 {"port": VALUES["serve"]["httpPort"], "protocol": "TCP"}]
    api = [r for r in rules if r.get("ports") == api_ports]
    assert api == [{"ports": api_ports, "from": clients}]
    assert any(r.get("ports") == [{"port": VALUES["metrics"]["port"], "protocol": "TCP"}] for r in rules)
    for rule in rules:
        assert schema_errors(rule, _ingress_rule_schema()) == []


def test_should_render_no_network_policy_when_disabled(render):
    assert not render((), **{"networkPolicy.enabled": False}).of_kind("NetworkPolicy")


# --------------------------------------------------------------------------- security


def _pod_specs(docs) -> list[tuple[str, dict[str, Any]]]:
    specs = [(f"ray:{t['metadata']['labels']['app.kubernetes.io/component']}", t["spec"])
             for t in view.ray_pod_templates(docs)]
    specs += [(f"deployment:{d['metadata']['name']}", d["spec"]["template"]["spec"])
              for d in docs.of_kind("Deployment")]
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
