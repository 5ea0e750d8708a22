"""The Helm chart helm/specdec, rendered by the real helm binary and read as a specification.

The RayService and its RayCluster config are validated against KubeRay's CRD schemas (from
shared/k8s/crds, strict about unknown fields); the Services, pod templates and claims the chart
renders outside the RayService are validated against the Kubernetes core schemas those CRDs
embed (Service, PodTemplateSpec, PodSpec, PersistentVolumeClaimSpec, NetworkPolicyIngressRule);
the embedded Serve config against Ray Serve's ServeDeploySchema and its args against specdec's
own config schema. Not checked offline: KubeRay's CEL rules (x-kubernetes-validations), the
apps/v1 Deployment and networking/v1 NetworkPolicy top-level fields (no schema for them here;
checked structurally), and the ServiceMonitor against the Prometheus Operator CRD.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

import pytest
import yaml

from deploy_helpers import (CHART_DIR, CI_VALUES, REPO_ROOT, HelmError, crd_schema,  # registered by conftest.py
                            load_module, run_helm, schema_errors, strip_source, sub_schema)

VALUE_SETS = {"default values": (), "ci values": (CI_VALUES,)}
VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
RAYSERVICE_CRD = "ray.io_rayservices.yaml"
RAYCLUSTER_CRD = "ray.io_rayclusters.yaml"


@pytest.fixture(params=sorted(VALUE_SETS), ids=sorted(VALUE_SETS))
def rendered(request, render):
    return render(VALUE_SETS[request.param])


def _rayservice(docs) -> dict[str, Any]:
    return strip_source(docs.one("RayService"))


def _cluster(docs) -> dict[str, Any]:
    return _rayservice(docs)["spec"]["rayClusterConfig"]


def _head(docs) -> dict[str, Any]:
    return _cluster(docs)["headGroupSpec"]


def _workers(docs) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in _cluster(docs).get("workerGroupSpecs", [])}


def _container(pod_template: dict[str, Any]) -> dict[str, Any]:
    return pod_template["spec"]["containers"][0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _serve_config(docs) -> dict[str, Any]:
    return yaml.safe_load(_rayservice(docs)["spec"]["serveConfigV2"])


def _ray_pod_templates(docs) -> list[dict[str, Any]]:
    return [_head(docs)["template"], *(g["template"] for g in _workers(docs).values())]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------- helm itself


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_helm_lint_passes_strictly(helm_bin, values):
    args = ["lint", "--strict", str(CHART_DIR)]
    for f in VALUE_SETS[values]:
        args += ["-f", str(f)]
    assert "0 chart(s) failed" in run_helm(helm_bin, *args)


def test_should_render_one_resource_per_template(render):
    everything = render((), **{"metrics.serviceMonitor.enabled": True, "redis.persistence.enabled": True})
    for source, docs in everything.by_source().items():
        assert len(docs) == 1, f"{source} renders {len(docs)} resources"
    assert everything.kinds() == sorted([
        "RayService", "Service", "Service", "Service", "Deployment", "Secret", "PersistentVolumeClaim",
        "NetworkPolicy", "NetworkPolicy", "ServiceMonitor", "Pod"])


def test_should_render_the_image_tag_of_the_app_version_by_default(render):
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    for template in _ray_pod_templates(render()):
        assert _container(template)["image"] == f"specdec:{chart['appVersion']}"


def test_install_notes_should_say_how_to_reach_the_grpc_port(helm_bin):
    out = run_helm(helm_bin, "install", "specdec", str(CHART_DIR), "-n", "specdec", "--dry-run=client")
    assert "kubectl port-forward -n specdec svc/specdec 50051:50051" in out
    assert "specdec client health --server localhost:50051" in out


# --------------------------------------------------------------------------- RayService vs KubeRay


def test_should_render_a_rayservice_valid_against_the_kuberay_crd(rendered, crds):
    rayservice = _rayservice(rendered)
    assert rayservice["apiVersion"] == "ray.io/v1"
    assert schema_errors(rayservice, crd_schema(RAYSERVICE_CRD)) == []


def test_should_render_a_ray_cluster_config_valid_against_the_raycluster_crd(rendered, crds):
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "specdec"},
               "spec": _cluster(rendered)}
    assert schema_errors(cluster, crd_schema(RAYCLUSTER_CRD)) == []


def test_crd_validation_should_catch_a_misspelled_field_and_a_duplicate_port(render, crds):
    rayservice = _rayservice(render())
    container = _container(rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"])
    container["imagePullPolicyy"] = "Always"
    container["ports"].append({"name": "grpc-again", "containerPort": VALUES["grpc"]["port"]})
    errors = schema_errors(rayservice, crd_schema(RAYSERVICE_CRD))
    assert any("imagePullPolicyy" in e for e in errors)
    assert any("duplicate entry" in e for e in errors)


def test_should_ask_kuberay_for_the_ray_version_of_the_image(rendered):
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={_cluster(rendered)['rayVersion']}" in dockerfile


# --------------------------------------------------------------------------- the Serve app


def test_embedded_serve_config_should_validate_with_ray_serves_schema(rendered):
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(_serve_config(rendered))
    (app,) = schema.applications
    assert app.import_path == VALUES["serve"]["importPath"] == "actors.app:build_app"
    assert schema.grpc_options.port == VALUES["grpc"]["port"]


def test_embedded_serve_config_should_have_no_keys_serve_ignores(rendered):
    from ray.serve.schema import (HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema,
                                  gRPCOptionsSchema)

    config = _serve_config(rendered)
    for model, mapping in ((ServeDeploySchema, config), (HTTPOptionsSchema, config["http_options"]),
                           (gRPCOptionsSchema, config["grpc_options"]),
                           (ServeApplicationSchema, config["applications"][0])):
        assert set(mapping) <= set(model.model_fields), model.__name__


def test_serve_app_should_have_a_route_prefix_so_the_proxies_route_grpc_to_it(rendered):
    (app,) = _serve_config(rendered)["applications"]
    assert app["route_prefix"] == f"/{VALUES['serve']['appName']}"


def test_serve_args_should_be_a_valid_specdec_config_listening_on_the_grpc_port(rendered):
    from specdec.config import load_config

    config = _serve_config(rendered)
    args = config["applications"][0]["args"]
    specdec_config = load_config(overrides=args)  # unknown keys / bad values raise
    assert specdec_config.serving.port == config["grpc_options"]["port"] == VALUES["grpc"]["port"]


def test_serve_args_should_come_from_values(render):
    docs = render((), **{"specdec.config": {"models": {"target": "org/big", "draft": "org/small"},
                                            "speculation": {"gamma": 6}}})
    args = _serve_config(docs)["applications"][0]["args"]
    assert args["models"]["target"] == "org/big" and args["speculation"]["gamma"] == 6


def test_grpc_servicer_functions_should_match_the_router(rendered):
    tree = ast.parse((REPO_ROOT / "actors" / "router.py").read_text())
    declared = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "GRPC_SERVICER_FUNCTIONS" for t in n.targets))
    assert _serve_config(rendered)["grpc_options"]["grpc_servicer_functions"] == declared


def test_serve_http_proxy_should_listen_on_all_interfaces_for_kuberays_health_checks(rendered):
    http = _serve_config(rendered)["http_options"]
    assert http == {"host": "0.0.0.0", "port": VALUES["serve"]["httpPort"]}
    ports = {p["name"]: p["containerPort"] for p in _container(_head(rendered)["template"])["ports"]}
    assert ports["serve"] == http["port"]


# --------------------------------------------------------------------------- head and workers


def test_head_group_should_run_no_model(rendered):
    head = _head(rendered)
    assert head["rayStartParams"]["num-gpus"] == "0"
    resources = _container(head["template"])["resources"]
    assert not any("gpu" in k for part in resources.values() for k in part)


def test_worker_groups_should_exist_for_the_target_and_the_draft(rendered):
    assert sorted(_workers(rendered)) == ["draft", "target"]


def test_default_target_group_should_hold_every_tensor_parallel_rank(render):
    serving = VALUES["specdec"]["config"]["serving"]
    target = _workers(render())["target"]
    limits = _container(target["template"])["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == serving["tensor_parallel_size"] * serving["target_num_gpus"] == 4
    draft_limits = _container(_workers(render())["draft"]["template"])["resources"]["limits"]
    assert draft_limits["nvidia.com/gpu"] == serving["draft_num_gpus"]


def test_worker_groups_should_take_resources_node_selectors_tolerations_and_replicas_from_values(render):
    toleration = {"key": "gpu-pool", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}
    docs = render((), **{"workerGroups.target.nodeSelector": {"pool": "a100"},
                         "workerGroups.target.tolerations": [toleration],
                         "workerGroups.target.replicas": 2,
                         "workerGroups.target.gpus": 8,
                         "workerGroups.draft.resources": {"limits": {"cpu": "3", "memory": "9Gi"}},
                         "gpuResourceName": "amd.com/gpu"})
    target, draft = _workers(docs)["target"], _workers(docs)["draft"]
    assert target["template"]["spec"]["nodeSelector"] == {"pool": "a100"}
    assert target["template"]["spec"]["tolerations"] == [toleration]
    assert target["replicas"] == target["minReplicas"] == target["maxReplicas"] == 2
    assert _container(target["template"])["resources"]["limits"]["amd.com/gpu"] == 8
    assert _container(draft["template"])["resources"]["limits"] == {"cpu": "3", "memory": "9Gi", "amd.com/gpu": 1}


def test_should_refuse_to_render_when_the_target_pod_has_fewer_gpus_than_ranks(render):
    with pytest.raises(HelmError, match="workerGroups.target.gpus"):
        render((), **{"workerGroups.target.gpus": 2})


def test_should_leave_out_a_disabled_worker_group(render):
    docs = render((CI_VALUES,), **{"workerGroups.draft.enabled": False})
    assert sorted(_workers(docs)) == ["target"]


def test_ci_values_should_request_no_gpus(render):
    docs = render((CI_VALUES,))
    for template in _ray_pod_templates(docs):
        resources = _container(template)["resources"]
        assert not any("gpu" in k for part in resources.values() for k in part)
        assert not template["spec"].get("tolerations")
    args = _serve_config(docs)["applications"][0]["args"]
    assert args["models"]["device"] == "cpu" and args["serving"]["target_num_gpus"] == 0


def test_ray_pods_should_get_the_redis_url_and_the_password_from_the_secret(rendered):
    secret = strip_source(rendered.one("Secret"))
    for template in _ray_pod_templates(rendered):
        env = _env(_container(template))
        assert env["SPECDEC_REDIS_URL"] == "redis://specdec-redis.serving.svc:6379/0"
        assert env["SPECDEC_REDIS_PASSWORD"] == {"secretKeyRef": {"name": secret["metadata"]["name"],
                                                                  "key": "redis-password"}}


def test_should_pass_a_hugging_face_token_from_an_existing_secret(render):
    docs = render((), **{"huggingface.tokenSecretName": "hf"})
    for template in _ray_pod_templates(docs):
        assert _env(_container(template))["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


# --------------------------------------------------------------------------- gRPC Service and probes


def test_should_expose_the_grpc_port_through_a_service_to_the_head_pod(rendered, crds):
    service = strip_source(rendered.one("Service", "specdec"))
    (port,) = service["spec"]["ports"]
    assert port["port"] == VALUES["service"]["port"] and port["targetPort"] == VALUES["grpc"]["port"]
    head = _head(rendered)["template"]
    selector = dict(service["spec"]["selector"])
    assert selector.pop("ray.io/serve") == "true"  # set by KubeRay on pods whose proxy serves
    assert _selects(selector, head["metadata"]["labels"])
    assert not any(_selects(selector, w["template"]["metadata"]["labels"]) for w in _workers(rendered).values())
    ports = {p["name"]: p["containerPort"] for p in _container(head)["ports"]}
    assert ports["grpc"] == port["targetPort"]
    assert schema_errors(service, crd_schema(RAYSERVICE_CRD)["properties"]["spec"]["properties"]["serveService"]) == []


def test_grpc_port_should_be_one_value_across_serve_service_probe_and_image(render):
    docs = render((), **{"grpc.port": 9443, "service.port": 443})
    config = _serve_config(docs)
    head = _container(_head(docs)["template"])
    assert config["grpc_options"]["port"] == config["applications"][0]["args"]["serving"]["port"] == 9443
    assert {p["name"]: p["containerPort"] for p in head["ports"]}["grpc"] == 9443
    assert head["livenessProbe"]["grpc"]["port"] == 9443
    assert strip_source(docs.one("Service", "specdec"))["spec"]["ports"][0]["targetPort"] == 9443


def test_head_should_have_a_native_grpc_liveness_probe_and_leave_readiness_to_kuberay(rendered):
    head = _container(_head(rendered)["template"])
    assert head["livenessProbe"]["grpc"] == {"port": VALUES["grpc"]["port"]}
    assert head["livenessProbe"]["initialDelaySeconds"] >= 300
    # KubeRay deploys the Serve app only after the head pod is Ready: an app-level readiness
    # probe would never pass, so the chart leaves the head's readiness to KubeRay
    assert "readinessProbe" not in head and "startupProbe" not in head


def test_worker_pods_should_be_ready_when_their_raylet_is_healthy(rendered):
    """KubeRay's default worker readiness also wants a Serve proxy on the pod; specdec's workers
    host model actors and the proxy runs on the head, so the chart checks the raylet instead
    (KubeRay keeps a user-defined httpGet probe)."""
    for name, group in _workers(rendered).items():
        probe = _container(group["template"])["readinessProbe"]
        assert probe["httpGet"] == {"path": "/api/local_raylet_healthz", "port": 52365}, name
    assert _serve_config(rendered)["proxy_location"] == "HeadOnly"


def test_should_fall_back_to_kuberays_worker_probe_when_asked(render):
    docs = render((), **{"rayPods.workerReadinessProbe": None})  # helm deletes a key set to null
    for group in _workers(docs).values():
        assert "readinessProbe" not in _container(group["template"])


def test_should_drop_the_grpc_liveness_probe_when_disabled(render):
    head = _container(_head(render((), **{"head.livenessProbe.enabled": False}))["template"])
    assert "livenessProbe" not in head


# --------------------------------------------------------------------------- Redis


def test_should_render_a_redis_with_a_password_from_a_secret_by_default(rendered, crds):
    deployment = strip_source(rendered.one("Deployment", "-redis"))
    service = strip_source(rendered.one("Service", "-redis"))
    secret = strip_source(rendered.one("Secret", "-redis"))
    assert secret["data"]["redis-password"]
    container = _container(deployment["spec"]["template"])
    assert "--requirepass" in container["args"] and "$(REDIS_PASSWORD)" in container["args"]
    assert _env(container)["REDIS_PASSWORD"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert _selects(service["spec"]["selector"], labels)
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
    assert _env(_container(docs.one("Deployment", "-redis")["spec"]["template"]))["REDIS_PASSWORD"] == ref
    for template in _ray_pod_templates(docs):
        assert _env(_container(template))["SPECDEC_REDIS_PASSWORD"] == ref


def test_should_render_a_claim_only_when_persistence_is_enabled(render, crds):
    docs = render((), **{"redis.persistence.enabled": True, "redis.persistence.storageClass": "fast"})
    claim = strip_source(docs.one("PersistentVolumeClaim"))
    assert claim["spec"]["storageClassName"] == "fast"
    claim_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec",
                                   "volumes", "[]", "ephemeral", "volumeClaimTemplate", "spec")
    assert schema_errors(claim["spec"], claim_spec_schema) == []
    volume = docs.one("Deployment", "-redis")["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert "--appendonly" in (args := _container(docs.one("Deployment")["spec"]["template"])["args"])
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
    for template in _ray_pod_templates(docs):
        env = _env(_container(template))
        assert env["SPECDEC_REDIS_URL"] == "redis://cache.example:6380/2"
        assert env["SPECDEC_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "ext", "key": "redis-password"}}


def test_should_store_an_external_redis_password_in_a_secret(render):
    docs = render((), **{"redis.enabled": False, "externalRedis.url": "redis://r:6379/0",
                         "externalRedis.password": "pw"})
    assert strip_source(docs.one("Secret"))["metadata"]["name"] == "specdec-redis"
    without = render((), **{"redis.enabled": False, "externalRedis.url": "redis://r:6379/0"})
    assert not without.of_kind("Secret")
    assert "SPECDEC_REDIS_PASSWORD" not in _env(_container(_head(without)["template"]))


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
    assert _selects(monitor["spec"]["selector"]["matchLabels"], metrics["metadata"]["labels"])
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in metrics["spec"]["ports"]]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    # the metrics Service reaches every Ray pod on the port Ray exports metrics on
    for template in _ray_pod_templates(docs):
        assert _selects(metrics["spec"]["selector"], template["metadata"]["labels"])
        ports = {p["name"]: p["containerPort"] for p in _container(template)["ports"]}
        assert ports["metrics"] == metrics["spec"]["ports"][0]["targetPort"] == VALUES["metrics"]["port"]
    assert _head(docs)["rayStartParams"]["metrics-export-port"] == str(VALUES["metrics"]["port"])


# --------------------------------------------------------------------------- NetworkPolicies


def _ingress_rule_schema():
    return sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "networkPolicy", "head", "ingressRules", "[]")


def test_should_render_network_policies_when_enabled(rendered, crds):
    ray_policy = strip_source(rendered.one("NetworkPolicy", "-ray"))
    redis_policy = strip_source(rendered.one("NetworkPolicy", "-redis"))
    ray_selector = ray_policy["spec"]["podSelector"]["matchLabels"]
    for template in _ray_pod_templates(rendered):
        assert _selects(ray_selector, template["metadata"]["labels"])
    redis_labels = rendered.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
    assert not _selects(ray_selector, redis_labels)
    assert _selects(redis_policy["spec"]["podSelector"]["matchLabels"], redis_labels)
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
    for template in _ray_pod_templates(rendered):
        assert _selects(peer["podSelector"]["matchLabels"], template["metadata"]["labels"])
    redis_labels = rendered.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
    assert not _selects(peer["podSelector"]["matchLabels"], redis_labels)


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
    specs = [(f"ray:{t['metadata']['labels']['app.kubernetes.io/component']}", t["spec"]) for t in _ray_pod_templates(docs)]
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
    assert _container(pod)["command"] == ["specdec", "client", "health", "--server",
                                          f"specdec:{VALUES['service']['port']}"]
    pod_spec_schema = sub_schema(crd_schema(RAYCLUSTER_CRD), "spec", "headGroupSpec", "template", "spec")
    assert schema_errors(pod["spec"], pod_spec_schema) == []


# --------------------------------------------------------------------------- values and README


def test_every_values_key_should_have_a_helm_docs_comment():
    readme = load_module("chart_readme", REPO_ROOT / "helm" / "chart_readme.py")
    rows = readme.values_rows(CHART_DIR / "values.yaml")  # raises on an undocumented key
    assert len(rows) > 50


def test_an_undocumented_values_key_should_be_reported(tmp_path):
    readme = load_module("chart_readme", REPO_ROOT / "helm" / "chart_readme.py")
    values = tmp_path / "values.yaml"
    values.write_text("section:\n  # -- documented\n  a: 1\n  b: 2\n")
    with pytest.raises(readme.UndocumentedKeys, match="section.b"):
        readme.values_rows(values)


def test_chart_readme_should_list_every_values_key_and_match_values_yaml():
    readme = load_module("chart_readme", REPO_ROOT / "helm" / "chart_readme.py")
    rows = readme.values_rows(CHART_DIR / "values.yaml")
    table = readme.readme_table(CHART_DIR / "README.md")
    for row in rows:
        assert f"| `{row.key}` |" in table, row.key
    assert table == readme.render_table(rows), "README.md is stale: run python3 helm/chart_readme.py helm/specdec"


def test_chart_readme_should_state_the_kuberay_operator_prerequisite():
    text = (CHART_DIR / "README.md").read_text()
    assert "KubeRay operator" in text and "does **not** install it" in text
    assert not list((CHART_DIR / "templates").glob("*crd*")) and not (CHART_DIR / "crds").exists()


def test_ci_values_should_only_use_keys_that_exist_in_values_yaml():
    def unknown(override: Any, base: Any, prefix: str = "") -> list[str]:
        if not isinstance(override, dict) or not isinstance(base, dict):
            return []
        out = []
        for key, value in override.items():
            path = f"{prefix}.{key}" if prefix else key
            if key not in base and not prefix.startswith("specdec.config"):
                out.append(path)
            elif key in base:
                out += unknown(value, base[key], path)
        return out

    assert unknown(yaml.safe_load(CI_VALUES.read_text()), copy.deepcopy(VALUES)) == []
