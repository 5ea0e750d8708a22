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

import chart_views as view
from chart_views import RAYCLUSTER_CRD, RAYSERVICE_CRD, VALUE_SETS, VALUES
from deploy_helpers import (CHART_DIR, CI_VALUES, REPO_ROOT, HelmError, crd_schema,  # registered by conftest.py
                            load_module, run_helm, schema_errors, strip_source)



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
        "RayService", "Service", "Service", "Service", "Deployment", "Secret", "Secret", "Secret",
        "PersistentVolumeClaim", "NetworkPolicy", "NetworkPolicy", "ServiceMonitor", "Pod",
        "PodDisruptionBudget", "ConfigMap"])


def test_should_render_the_image_tag_of_the_app_version_by_default(render):
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    for template in view.ray_pod_templates(render()):
        assert view.container(template)["image"] == f"specdec:{chart['appVersion']}"


def test_install_notes_should_say_how_to_reach_the_grpc_port(helm_bin):
    out = run_helm(helm_bin, "install", "specdec", str(CHART_DIR), "-n", "specdec", "--dry-run=client")
    assert "kubectl port-forward -n specdec svc/specdec 50051:50051" in out
    assert "specdec client health --server localhost:50051" in out


# --------------------------------------------------------------------------- RayService vs KubeRay


def test_should_render_a_rayservice_valid_against_the_kuberay_crd(rendered, crds):
    rayservice = view.rayservice(rendered)
    assert rayservice["apiVersion"] == "ray.io/v1"
    assert schema_errors(rayservice, crd_schema(RAYSERVICE_CRD)) == []


def test_should_render_a_ray_cluster_config_valid_against_the_raycluster_crd(rendered, crds):
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "specdec"},
               "spec": view.cluster(rendered)}
    assert schema_errors(cluster, crd_schema(RAYCLUSTER_CRD)) == []


def test_crd_validation_should_catch_a_misspelled_field_and_a_duplicate_port(render, crds):
    rayservice = view.rayservice(render())
    container = view.container(rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"])
    container["imagePullPolicyy"] = "Always"
    container["ports"].append({"name": "grpc-again", "containerPort": VALUES["grpc"]["port"]})
    errors = schema_errors(rayservice, crd_schema(RAYSERVICE_CRD))
    assert any("imagePullPolicyy" in e for e in errors)
    assert any("duplicate entry" in e for e in errors)


def test_should_ask_kuberay_for_the_ray_version_of_the_image(rendered):
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={view.cluster(rendered)['rayVersion']}" in dockerfile


# --------------------------------------------------------------------------- the Serve app


def test_embedded_serve_config_should_validate_with_ray_serves_schema(rendered):
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(view.serve_config(rendered))
    (app,) = schema.applications
    assert app.import_path == VALUES["serve"]["importPath"] == "actors.app:build_app"
    assert schema.grpc_options.port == VALUES["grpc"]["port"]


def test_embedded_serve_config_should_have_no_keys_serve_ignores(rendered):
    from ray.serve.schema import (HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema,
                                  gRPCOptionsSchema)

    config = view.serve_config(rendered)
    for model, mapping in ((ServeDeploySchema, config), (HTTPOptionsSchema, config["http_options"]),
                           (gRPCOptionsSchema, config["grpc_options"]),
                           (ServeApplicationSchema, config["applications"][0])):
        assert set(mapping) <= set(model.model_fields), model.__name__


def test_serve_app_should_have_a_route_prefix_so_the_proxies_route_grpc_and_http_to_it(rendered):
    """Route prefix "/" as `specdec serve` uses: the HTTP API's /v1/... paths at the root of the
    HTTP port (what OpenAI clients expect of a base_url ending in /v1), and the app is an endpoint
    of the gRPC proxy."""
    (app,) = view.serve_config(rendered)["applications"]
    assert app["route_prefix"] == "/"
    app_py = (REPO_ROOT / "actors" / "app.py").read_text()
    assert 'route_prefix="/"' in app_py


def test_serve_args_should_be_a_valid_specdec_config_listening_on_the_grpc_port(rendered):
    from specdec.config.config import load_config

    config = view.serve_config(rendered)
    args = config["applications"][0]["args"]
    specdec_config = load_config(overrides=args)  # unknown keys / bad values raise
    assert specdec_config.serving.port == config["grpc_options"]["port"] == VALUES["grpc"]["port"]


def test_serve_args_should_come_from_values(render):
    docs = render((), **{"specdec.config": {"models": {"target": "org/big", "draft": "org/small"},
                                            "speculation": {"gamma": 6}}})
    args = view.serve_config(docs)["applications"][0]["args"]
    assert args["models"]["target"] == "org/big" and args["speculation"]["gamma"] == 6


def test_grpc_servicer_functions_should_match_the_router(rendered):
    tree = ast.parse((REPO_ROOT / "actors" / "router.py").read_text())
    declared = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "GRPC_SERVICER_FUNCTIONS" for t in n.targets))
    assert view.serve_config(rendered)["grpc_options"]["grpc_servicer_functions"] == declared


def test_serve_http_proxy_should_listen_on_all_interfaces_for_kuberays_health_checks(rendered):
    http = view.serve_config(rendered)["http_options"]
    assert http == {"host": "0.0.0.0", "port": VALUES["serve"]["httpPort"]}
    ports = {p["name"]: p["containerPort"] for p in view.container(view.head(rendered)["template"])["ports"]}
    assert ports["serve"] == http["port"]


# --------------------------------------------------------------------------- head and workers


def test_head_group_should_run_no_model(rendered):
    head = view.head(rendered)
    assert head["rayStartParams"]["num-gpus"] == "0"
    resources = view.container(head["template"])["resources"]
    assert not any("gpu" in k for part in resources.values() for k in part)


def test_worker_groups_should_exist_for_the_target_and_the_draft(rendered):
    assert sorted(view.workers(rendered)) == ["draft", "target"]


def test_default_target_group_should_hold_every_tensor_parallel_rank(render):
    serving = VALUES["specdec"]["config"]["serving"]
    target = view.workers(render())["target"]
    limits = view.container(target["template"])["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == serving["tensor_parallel_size"] * serving["target_num_gpus"] == 4
    draft_limits = view.container(view.workers(render())["draft"]["template"])["resources"]["limits"]
    assert draft_limits["nvidia.com/gpu"] == serving["draft_num_gpus"]


def test_worker_groups_should_take_resources_node_selectors_tolerations_and_replicas_from_values(render):
    toleration = {"key": "gpu-pool", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}
    docs = render((), **{"workerGroups.target.nodeSelector": {"pool": "a100"},
                         "workerGroups.target.tolerations": [toleration],
                         "workerGroups.target.replicas": 2,
                         "workerGroups.target.gpus": 8,
                         "workerGroups.draft.resources": {"limits": {"cpu": "3", "memory": "9Gi"}},
                         "gpuResourceName": "amd.com/gpu"})
    target, draft = view.workers(docs)["target"], view.workers(docs)["draft"]
    assert target["template"]["spec"]["nodeSelector"] == {"pool": "a100"}
    assert target["template"]["spec"]["tolerations"] == [toleration]
    assert target["replicas"] == target["minReplicas"] == target["maxReplicas"] == 2
    assert view.container(target["template"])["resources"]["limits"]["amd.com/gpu"] == 8
    assert view.container(draft["template"])["resources"]["limits"] == {"cpu": "3", "memory": "9Gi", "amd.com/gpu": 1}


def test_should_refuse_to_render_when_the_target_pod_has_fewer_gpus_than_ranks(render):
    with pytest.raises(HelmError, match="workerGroups.target.gpus"):
        render((), **{"workerGroups.target.gpus": 2})


def test_should_leave_out_a_disabled_worker_group(render):
    docs = render((CI_VALUES,), **{"workerGroups.draft.enabled": False})
    assert sorted(view.workers(docs)) == ["target"]


def test_ci_values_should_request_no_gpus(render):
    docs = render((CI_VALUES,))
    for template in view.ray_pod_templates(docs):
        resources = view.container(template)["resources"]
        assert not any("gpu" in k for part in resources.values() for k in part)
        assert not template["spec"].get("tolerations")
    args = view.serve_config(docs)["applications"][0]["args"]
    assert args["models"]["device"] == "cpu" and args["serving"]["target_num_gpus"] == 0


def test_ray_pods_should_get_the_redis_url_and_the_password_from_the_secret(rendered):
    secret = strip_source(rendered.one("Secret", "-redis"))
    for template in view.ray_pod_templates(rendered):
        env = view.env(view.container(template))
        assert env["SPECDEC_REDIS_URL"] == "redis://specdec-redis.serving.svc:6379/0"
        assert env["SPECDEC_REDIS_PASSWORD"] == {"secretKeyRef": {"name": secret["metadata"]["name"],
                                                                  "key": "redis-password"}}


def test_should_pass_a_hugging_face_token_from_an_existing_secret(render):
    docs = render((), **{"huggingface.tokenSecretName": "hf"})
    for template in view.ray_pod_templates(docs):
        assert view.env(view.container(template))["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


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


def test_every_ray_container_starts_with_the_stack_environment_specdec_serve_gives(rendered):
    from actors.stack_environment import STACK_ENVIRONMENT

    for template in view.ray_pod_templates(rendered):
        env = view.env(view.container(template))
        assert {name: env.get(name) for name in STACK_ENVIRONMENT} == STACK_ENVIRONMENT
