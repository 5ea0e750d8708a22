"""The Helm chart's network and security surface, read as a specification: the gRPC Service and
probes, Redis and its Secret, the ServiceMonitor, NetworkPolicies and pod security contexts
(rendered by the real helm binary; schemas as in test_helm_chart.py)."""

from __future__ import annotations

from typing import Any

import pytest

import chart_views as view
from chart_views import RAYCLUSTER_CRD, RAYSERVICE_CRD, VALUES
from deploy_helpers import CHART_DIR, HelmError, crd_schema, run_helm, schema_errors, strip_source, sub_schema  # noqa: E501  registered by conftest.py


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


# --------------------------------------------------------------------------- Redis


def test_should_render_a_redis_with_a_password_from_a_secret_by_default(rendered, crds):
    deployment = strip_source(rendered.one("Deployment", "-redis"))
    service = strip_source(rendered.one("Service", "-redis"))
    secret = strip_source(rendered.one("Secret", "-redis"))
    assert secret["data"]["redis-password"]
    container = view.container(deployment["spec"]["template"])
    # the password is configuration on stdin, never an argument (argv is visible to `ps`)
    assert "requirepass" not in " ".join(container.get("args", [])) and "--requirepass" not in container["command"][-1]
    assert "$(REDIS_PASSWORD)" not in str(container)
    assert view.env(container)["REDIS_PASSWORD"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert view.selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert view.selects(service["spec"]["selector"], labels)
    assert not rendered.of_kind("PersistentVolumeClaim")
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert {"emptyDir": {}} == {k: v for k, v in volume.items() if k != "name"}
    pod_template_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template")
    assert schema_errors(deployment["spec"]["template"], pod_template_schema) == []
    service_schema = crd_schema(RAYSERVICE_CRD)["properties"]["spec"]["properties"]["serveService"]
    assert schema_errors(service, service_schema) == []


def _redis_start(docs, password: str, tmp_path) -> tuple[list[str], str]:
    """Run the Redis container's start script with a fake redis-server that records its argv
    and the configuration it reads on stdin."""
    import os
    import subprocess

    container = view.container(docs.one("Deployment", "-redis")["spec"]["template"])
    fake = tmp_path / "redis-server"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$OUT.argv"\ncat > "$OUT.stdin"\n')
    fake.chmod(0o755)
    out = tmp_path / "run"
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "REDIS_PASSWORD": password, "OUT": str(out)}
    subprocess.run(container["command"], env=env, check=True, timeout=30)
    return (tmp_path / "run.argv").read_text().splitlines(), (tmp_path / "run.stdin").read_text()


@pytest.mark.parametrize("password", ["Zq8ObaJ2", 'we"ird\\pass word'])
def test_redis_should_get_its_password_on_stdin_not_in_argv(render, tmp_path, password):
    argv, config = _redis_start(render(), password, tmp_path)
    assert all(password not in a for a in argv) and "--requirepass" not in argv
    assert argv[0] == "-" and argv[argv.index("--appendonly") + 1] == "no"
    escaped = password.replace("\\", "\\\\").replace('"', '\\"')
    assert config.strip() == f'requirepass "{escaped}"'


def test_redis_values_should_hold_no_plain_text_password(helm_bin):
    for section in ("auth",):
        assert "password" not in VALUES["redis"][section]
    assert "password" not in VALUES["externalRedis"]
    with pytest.raises(HelmError, match="password"):
        run_helm(helm_bin, "template", "specdec", str(CHART_DIR), "--set", "redis.auth.password=s3cret")
    with pytest.raises(HelmError, match="password"):
        run_helm(helm_bin, "template", "specdec", str(CHART_DIR), "--set", "redis.enabled=false",
                 "--set", "externalRedis.url=redis://r:6379/0", "--set", "externalRedis.password=pw")


def test_secrets_should_be_stable_across_renders_with_existing_secrets(helm_bin):
    """Plain `helm template` cannot look a generated Secret up; with existing Secrets every render
    is the same (GitOps), and no Secret is rendered at all."""
    sets = ["--set", "redis.auth.existingSecret=r", "--set", "security.auth.existingSecret=t",
            "--set", "security.internal.existingSecret=i"]
    first = run_helm(helm_bin, "template", "specdec", str(CHART_DIR), *sets)
    assert first == run_helm(helm_bin, "template", "specdec", str(CHART_DIR), *sets)
    assert "kind: Secret" not in first


def _render_against(helm_bin, api) -> str:
    """`helm template --dry-run=server` against the fake API server: lookups see its Secrets."""
    return run_helm(helm_bin, "template", "specdec", str(CHART_DIR), "--namespace", "serving",
                    "--dry-run=server", "--kube-apiserver", api.url, "--disable-openapi-validation")


def _secret_data(text: str) -> dict[str, dict[str, str]]:
    import base64

    import yaml

    docs = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "Secret"]
    return {d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()} for d in docs}


def test_generated_secrets_should_keep_their_values_on_renders_that_see_the_cluster(helm_bin):
    """The Redis password, the API token and the internal secret are generated on the first
    install and read back (lookup) by every later render with cluster access (`helm upgrade`,
    `helm template --dry-run=server`): the manifests are identical from render to render."""
    from fake_kube_api import FakeKubeApi

    stored = {("serving", "specdec-redis"): {"redis-password": "stored-redis-password"},
              ("serving", "specdec-api-tokens"): {"tokens": "stored-api-token"},
              ("serving", "specdec-internal"): {"secret": "stored-internal-secret"}}
    with FakeKubeApi("specdec", stored) as api:
        first, second = _render_against(helm_bin, api), _render_against(helm_bin, api)
        assert {"/api/v1/namespaces/serving/secrets/specdec-redis",
                "/api/v1/namespaces/serving/secrets/specdec-api-tokens",
                "/api/v1/namespaces/serving/secrets/specdec-internal"} <= set(api.requests)
    assert first == second
    assert _secret_data(first) == {"specdec-redis": {"redis-password": "stored-redis-password"},
                                   "specdec-api-tokens": {"tokens": "stored-api-token"},
                                   "specdec-internal": {"secret": "stored-internal-secret"}}


def test_a_first_install_should_generate_strong_secrets(helm_bin):
    from fake_kube_api import FakeKubeApi

    with FakeKubeApi("specdec", {}) as api:
        first, second = _secret_data(_render_against(helm_bin, api)), _secret_data(_render_against(helm_bin, api))
    for name, key, length in (("specdec-redis", "redis-password", 32), ("specdec-api-tokens", "tokens", 48),
                              ("specdec-internal", "secret", 48)):
        assert len(first[name][key]) == length and first[name][key].isalnum(), name
        assert first[name][key] != second[name][key], f"{name}: nothing stored yet, so a fresh random value"


def test_should_render_a_claim_only_when_persistence_is_enabled(render, crds):
    docs = render((), **{"redis.persistence.enabled": True, "redis.persistence.storageClass": "fast"})
    claim = strip_source(docs.one("PersistentVolumeClaim"))
    assert claim["spec"]["storageClassName"] == "fast"
    claim_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec",
                                   "volumes", "[]", "ephemeral", "volumeClaimTemplate", "spec")
    assert schema_errors(claim["spec"], claim_spec_schema) == []
    volume = docs.one("Deployment", "-redis")["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert "--appendonly yes" in view.container(docs.one("Deployment")["spec"]["template"])["command"][-1]
    existing = render((), **{"redis.persistence.enabled": True, "redis.persistence.existingClaim": "old"})
    assert not existing.of_kind("PersistentVolumeClaim")
    volume = existing.one("Deployment")["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"] == {"claimName": "old"}


def test_should_not_render_redis_when_an_external_url_is_given(render):
    docs = render((), **{"redis.enabled": False, "externalRedis.url": "redis://cache.example:6380/2",
                         "externalRedis.existingSecret": "ext", "metrics.serviceMonitor.enabled": False})
    assert not docs.of_kind("Deployment") and not docs.of_kind("PersistentVolumeClaim")
    assert not [s for s in docs.of_kind("Secret") if s["metadata"]["name"].endswith("-redis")]
    assert [s["metadata"]["name"] for s in docs.of_kind("Service")] == ["specdec"]
    assert [n["metadata"]["name"] for n in docs.of_kind("NetworkPolicy")] == ["specdec-ray"]
    for template in view.ray_pod_templates(docs):
        env = view.env(view.container(template))
        assert env["SPECDEC_REDIS_URL"] == "redis://cache.example:6380/2"
        assert env["SPECDEC_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "ext", "key": "redis-password"}}


def test_external_redis_without_a_secret_has_no_password(render):
    without = render((), **{"redis.enabled": False, "externalRedis.url": "redis://r:6379/0"})
    assert "SPECDEC_REDIS_PASSWORD" not in view.env(view.container(view.head(without)["template"]))
    assert "redisPassword" not in view.cluster(without)["gcsFaultToleranceOptions"]


def test_external_tls_redis_should_get_its_ca_and_a_gcs_address(render, crds):
    docs = render((), **{"redis.enabled": False, "externalRedis.url": "rediss://cache.example:6380/2",
                         "externalRedis.existingSecret": "ext", "externalRedis.caSecret": "redis-ca"})
    for template in view.ray_pod_templates(docs):
        env = view.env(view.container(template))
        assert env["SPECDEC_REDIS_URL"] == "rediss://cache.example:6380/2?ssl_ca_certs=/etc/specdec/redis-ca/ca.crt"
        assert env["RAY_REDIS_CA_CERT"] == "/etc/specdec/redis-ca/ca.crt"
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["redis-ca"]["secret"]["secretName"] == "redis-ca"
        mounts = {m["name"]: m["mountPath"] for m in view.container(template)["volumeMounts"]}
        assert mounts["redis-ca"] == "/etc/specdec/redis-ca"
    ft = view.cluster(docs)["gcsFaultToleranceOptions"]
    assert ft["redisAddress"] == "rediss://cache.example:6380"
    assert ft["redisPassword"] == {"valueFrom": {"secretKeyRef": {"name": "ext", "key": "redis-password"}}}
    egress = strip_source(docs.one("NetworkPolicy", "-ray"))["spec"]["egress"]
    assert {"ports": [{"port": 6380, "protocol": "TCP"}]} in egress
    assert schema_errors(view.rayservice(docs), crd_schema(RAYSERVICE_CRD)) == []


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
