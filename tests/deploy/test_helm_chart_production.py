"""The chart's production surface (issue 13), rendered by the real helm binary: values.schema.json,
API security (tokens, TLS, internal secret) as specdec `security.*` args, KubeRay's Ray token
authentication, GCS fault tolerance and upgrade strategy, the read-only root filesystem, the
PodDisruptionBudget (the Grafana dashboard has a file of its own: test_helm_chart_dashboard.py)."""

from __future__ import annotations

import ast
import json
import re

import pytest
import yaml

import chart_views as view
from chart_views import RAYSERVICE_CRD, VALUE_SETS, VALUES
from deploy_helpers import (CHART_DIR, REPO_ROOT, HelmError, crd_schema, run_helm,  # registered by conftest.py
                            schema_errors, strip_source)

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


# --------------------------------------------------------------------------- values.schema.json


def _schema_paths(node, prefix=""):
    """Dotted paths of every property the schema closes (additionalProperties: false)."""
    out = set()
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        out.add(path)
        if sub.get("additionalProperties") is False:
            out |= _schema_paths(sub, path)
    return out


def test_schema_should_describe_every_values_key_and_nothing_else():
    assert SCHEMA.get("additionalProperties") is False
    closed = {p for p in _schema_paths(SCHEMA)}
    values = set()

    def walk(node, schema, prefix=""):
        for key, sub in node.items():
            path = f"{prefix}.{key}" if prefix else key
            values.add(path)
            sub_schema = schema["properties"][key]
            if isinstance(sub, dict) and sub_schema.get("additionalProperties") is False:
                walk(sub, sub_schema, path)

    walk(VALUES, SCHEMA)
    assert values <= closed
    stale = {p for p in closed if p not in values and not p.startswith("specdec.config.")}
    assert not stale, f"schema keys no longer in values.yaml: {sorted(stale)}"


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_default_and_ci_values_should_pass_the_schema(render, values):
    assert render(VALUE_SETS[values]).of_kind("RayService")


@pytest.mark.parametrize("sets, message", [
    ({"grpc.portt": 50051}, "portt"),                                   # typo'd key
    ({"workerGroups.target.gpu": 4}, "gpu"),                            # typo'd nested key
    ({"redis.auth.password": "s3cret"}, "password"),                    # removed: no plain-text passwords
    ({"grpc.port": 70000}, "65"),                                       # impossible port
    ({"service.type": "Loadbalancer"}, "LoadBalancer"),                 # not a Service type
    ({"workerGroups.target.replicas": -1}, "minimum"),
    ({"workerGroups.draft.gpus": "one"}, "number"),
    ({"upgradeStrategy.type": "Rolling"}, "NewCluster"),
    ({"upgradeStrategy.type": "NewClusterWithIncrementalUpgrade"}, "NewCluster"),  # needs options not rendered
    ({"head.livenessProbe.failureThreshold": 0}, "minimum"),
    ({"rayPods.tmpSizeLimit": "lots"}, "pattern"),
    ({"specdec.config.cache.max_seq_len": 0}, "minimum"),
    ({"specdec.config.serving.port": 1234}, "serving/port"),            # set by the chart, not by hand
    ({"specdec.config.security": {"api_tokens_file": "/x"}}, "config/security"),  # from security.*
    ({"externalRedis.url": "redis://user:pw@r:6379/0"}, "externalRedis/url"),  # no password in the URL
    ({"podDisruptionBudget.maxUnavailable": "half"}, "maxUnavailable"),
])
def test_a_typo_or_an_impossible_value_should_fail_rendering(render, sets, message):
    with pytest.raises(HelmError, match=re.escape(message)):
        render((), **sets)


def test_helm_install_should_refuse_a_typo_too(helm_bin):
    with pytest.raises(HelmError, match="replicass"):
        run_helm(helm_bin, "install", "specdec", str(CHART_DIR), "--dry-run=client",
                 "--set", "workerGroups.target.replicass=2")


# --------------------------------------------------------------------------- API security


def _args(docs):
    return view.serve_config(docs)["applications"][0]["args"]


def _mounts(template):
    return {m["name"]: m for m in view.container(template)["volumeMounts"]}


def _volumes(template):
    return {v["name"]: v for v in template["spec"]["volumes"]}


def test_auth_should_be_on_by_default_with_a_generated_token_file_on_every_ray_pod(rendered):
    security = _args(rendered)["security"]
    assert security["api_tokens_file"] == "/etc/specdec/api-tokens/tokens"
    assert security["internal_secret_file"] == "/etc/specdec/internal/secret"
    assert security["open_health"] is True
    assert "tls_cert_file" not in security and "tls_key_file" not in security  # TLS needs a cert Secret
    tokens = strip_source(rendered.one("Secret", "-api-tokens"))
    internal = strip_source(rendered.one("Secret", "-internal"))
    assert tokens["data"]["tokens"] and internal["data"]["secret"]
    for template in view.ray_pod_templates(rendered):
        volumes, mounts = _volumes(template), _mounts(template)
        assert volumes["api-tokens"]["secret"]["secretName"] == tokens["metadata"]["name"]
        assert volumes["internal-secret"]["secret"]["secretName"] == internal["metadata"]["name"]
        assert mounts["api-tokens"]["mountPath"] + "/tokens" == security["api_tokens_file"]
        assert mounts["internal-secret"]["mountPath"] + "/secret" == security["internal_secret_file"]
        assert all(mounts[n]["readOnly"] for n in ("api-tokens", "internal-secret"))
        assert volumes["api-tokens"]["secret"]["defaultMode"] == 0o440


def test_no_secret_value_should_appear_in_args_or_env(rendered):
    """Secrets reach the pods as mounted files or secretKeyRefs, never as literal values."""
    secret_values = {v for s in rendered.of_kind("Secret") for v in s["data"].values()}
    import base64
    plain = {base64.b64decode(v).decode() for v in secret_values}
    text = yaml.safe_dump([strip_source(d) for d in rendered if d["kind"] != "Secret"])
    for value in plain:
        assert value not in text


def test_tls_and_existing_token_and_internal_secrets_should_be_mounted_as_files(render, crds):
    docs = render((), **{"security.tls.existingSecret": "api-cert", "security.auth.existingSecret": "tokens",
                         "security.auth.secretKey": "list", "security.auth.openHealth": False,
                         "security.internal.existingSecret": "shared"})
    security = _args(docs)["security"]
    assert security == {"tls_cert_file": "/etc/specdec/tls/tls.crt", "tls_key_file": "/etc/specdec/tls/tls.key",
                        "api_tokens_file": "/etc/specdec/api-tokens/list", "open_health": False,
                        "internal_secret_file": "/etc/specdec/internal/secret"}
    assert not docs.of_kind("Secret")[1:]
    assert [s["metadata"]["name"] for s in docs.of_kind("Secret")] == ["specdec-redis"]
    for template in view.ray_pod_templates(docs):
        volumes = _volumes(template)
        assert volumes["api-tls"]["secret"]["secretName"] == "api-cert"
        assert volumes["api-tokens"]["secret"]["secretName"] == "tokens"
        assert volumes["internal-secret"]["secret"]["secretName"] == "shared"
    service = strip_source(docs.one("Service", "specdec"))
    assert [p.get("appProtocol") for p in service["spec"]["ports"]] == [None, "http"]  # TLS gRPC, plaintext HTTP
    assert schema_errors(view.rayservice(docs), crd_schema(RAYSERVICE_CRD)) == []


def _public_tls_constants() -> dict[str, str]:
    """SERVICER_FUNCTION and the *_ENV names of specdec_rpc/public/public_tls.py, read from the code."""
    tree = ast.parse((REPO_ROOT / "specdec_rpc" / "public" / "public_tls.py").read_text())
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts):
                        out[t.id] = ast.literal_eval(v)
            if names and isinstance(node.value, ast.Constant):
                out[names[0]] = node.value.value
    return out


def test_tls_should_add_specdecs_tls_port_to_serves_grpc_proxy(render):
    """Serve's gRPC proxy has no TLS option: public_tls's servicer function adds the TLS port
    (grpc.port) from environment variables; Serve's plaintext port moves to grpc.tlsInternalPort,
    on the head pod's loopback."""
    tls = _public_tls_constants()
    docs = render((), **{"security.tls.existingSecret": "api-cert"})
    grpc_options = view.serve_config(docs)["grpc_options"]
    assert grpc_options["port"] == VALUES["grpc"]["tlsInternalPort"] != VALUES["grpc"]["port"]
    assert grpc_options["grpc_servicer_functions"] == [
        *VALUES["serve"]["grpcServicerFunctions"], tls["SERVICER_FUNCTION"]]
    assert _args(docs)["serving"]["port"] == VALUES["grpc"]["port"]
    for template in view.ray_pod_templates(docs):
        env = view.env(view.container(template))
        assert env[tls["PORT_ENV"]] == str(VALUES["grpc"]["port"])
        assert env[tls["CERT_ENV"]] == "/etc/specdec/tls/tls.crt" and env[tls["KEY_ENV"]] == "/etc/specdec/tls/tls.key"
        # Serve's proxy start-up hook binds Serve's plaintext port to loopback (actors/serve_proxy.py)
        assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "actors.serve_proxy.setup_proxy"
    ports = {p["name"]: p["containerPort"] for p in view.container(view.head(docs)["template"])["ports"]}
    assert ports["grpc"] == VALUES["grpc"]["port"] and ports["grpc-internal"] == VALUES["grpc"]["tlsInternalPort"]
    service = strip_source(docs.one("Service", "specdec"))
    assert service["spec"]["ports"][0]["targetPort"] == VALUES["grpc"]["port"]
    open_ports = [p["port"] for r in strip_source(docs.one("NetworkPolicy", "-ray"))["spec"]["ingress"]
                  if "from" not in r for p in r["ports"]]
    assert VALUES["grpc"]["tlsInternalPort"] not in open_ports
    plain = render()
    assert "SPECDEC_TLS_PORT" not in view.env(view.container(view.head(plain)["template"]))
    with pytest.raises(HelmError, match="tlsInternalPort"):
        render((), **{"security.tls.existingSecret": "api-cert", "grpc.tlsInternalPort": VALUES["grpc"]["port"]})


def test_auth_can_be_turned_off(render):
    docs = render((), **{"security.auth.enabled": False})
    assert "api_tokens_file" not in _args(docs)["security"]
    assert not [s for s in docs.of_kind("Secret") if s["metadata"]["name"].endswith("-api-tokens")]
    assert "api-tokens" not in _volumes(view.head(docs)["template"])


def test_serve_args_with_security_should_be_a_valid_specdec_config(render):
    from specdec.config.config import load_config

    docs = render((), **{"security.tls.existingSecret": "api-cert"})
    config = load_config(overrides=_args(docs))
    assert config.security.api_tokens_file and config.security.tls_cert_file.endswith("tls.crt")
    assert config.serving.http_port == VALUES["serve"]["httpPort"]


# --------------------------------------------------------------------------- KubeRay options


def test_ray_token_authentication_should_be_on(rendered, crds):
    cluster = view.cluster(rendered)
    assert cluster["authOptions"] == {"mode": "token"}
    assert schema_errors(view.rayservice(rendered), crd_schema(RAYSERVICE_CRD)) == []


def test_ray_token_authentication_can_use_a_secret_or_be_disabled(render):
    assert view.cluster(render((), **{"ray.auth.secretName": "ray-token"}))["authOptions"] == {
        "mode": "token", "secretName": "ray-token"}
    assert view.cluster(render((), **{"ray.auth.enabled": False}))["authOptions"] == {"mode": "disabled"}


def test_gcs_fault_tolerance_should_use_the_charts_redis_and_its_password(rendered):
    ft = view.cluster(rendered)["gcsFaultToleranceOptions"]
    redis_service = strip_source(rendered.one("Service", "-redis"))
    redis_port = redis_service["spec"]["ports"][0]["port"]
    assert ft["redisAddress"] == f"{redis_service['metadata']['name']}.serving.svc:{redis_port}"
    secret = strip_source(rendered.one("Secret", "-redis"))
    assert ft["redisPassword"] == {"valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"],
                                                                  "key": "redis-password"}}}


def test_gcs_fault_tolerance_can_be_turned_off(render):
    docs = render((), **{"ray.gcsFaultTolerance.enabled": False})
    assert "gcsFaultToleranceOptions" not in view.cluster(docs)


def test_upgrade_strategy_should_be_configurable(render, crds):
    spec = view.rayservice(render())["spec"]
    assert spec["upgradeStrategy"] == {"type": "NewCluster"} and spec["rayClusterDeletionDelaySeconds"] == 60
    docs = render((), **{"upgradeStrategy.type": "None", "upgradeStrategy.rayClusterDeletionDelaySeconds": 0})
    spec = view.rayservice(docs)["spec"]
    assert spec["upgradeStrategy"] == {"type": "None"} and spec["rayClusterDeletionDelaySeconds"] == 0
    assert schema_errors(view.rayservice(docs), crd_schema(RAYSERVICE_CRD)) == []


# --------------------------------------------------------------------------- filesystem, PDB


def test_ray_containers_should_have_a_read_only_root_and_writable_emptydirs(rendered):
    for template in view.ray_pod_templates(rendered):
        container = view.container(template)
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts, volumes = _mounts(template), _volumes(template)
        for name, path in (("tmp", "/tmp"), ("home-cache", "/home/specdec/.cache"), ("dshm", "/dev/shm")):
            assert mounts[name]["mountPath"] == path and "emptyDir" in volumes[name]
            assert volumes[name]["emptyDir"]["sizeLimit"]
        env = view.env(container)
        for var in ("HF_HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR"):
            assert env[var].startswith("/home/specdec/.cache"), var
    redis = view.container(rendered.one("Deployment", "-redis")["spec"]["template"])
    assert redis["securityContext"]["readOnlyRootFilesystem"] is True


def test_read_only_root_can_be_turned_off(render):
    docs = render((), **{"rayPods.readOnlyRootFilesystem": False})
    for template in view.ray_pod_templates(docs):
        assert view.container(template)["securityContext"]["readOnlyRootFilesystem"] is False


def test_pod_disruption_budget_should_cover_every_ray_pod(rendered):
    pdb = strip_source(rendered.one("PodDisruptionBudget"))
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 0
    for template in view.ray_pod_templates(rendered):
        assert view.selects(pdb["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    redis_labels = rendered.one("Deployment", "-redis")["spec"]["template"]["metadata"]["labels"]
    assert not view.selects(pdb["spec"]["selector"]["matchLabels"], redis_labels)


def test_pod_disruption_budget_can_allow_evictions_or_be_left_out(render):
    budget = render((), **{"podDisruptionBudget.maxUnavailable": 1}).one("PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert not render((), **{"podDisruptionBudget.enabled": False}).of_kind("PodDisruptionBudget")


def test_default_cache_should_be_sized_for_the_gpu_model_not_1024_tokens():
    cache = VALUES["specdec"]["config"]["cache"]
    assert cache["max_seq_len"] >= 8192 and cache["max_seq_len"] <= 32768  # Qwen2.5-14B's context
    ci = yaml.safe_load((CHART_DIR / "ci" / "ci-values.yaml").read_text())["specdec"]["config"]["cache"]
    bundled = json.loads((REPO_ROOT / "specdec" / "bundled" / "target" / "config.json").read_text())
    assert ci["max_seq_len"] <= bundled["max_position_embeddings"]


def test_the_image_has_what_the_probes_run():
    """The head's probes run `bash -c "wget ... | grep success"` in the specdec image."""
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert re.search(r"apt-get install[^\n]*\bwget\b", dockerfile)
    assert "python:3." in dockerfile and "slim" in dockerfile  # Debian slim: bash and grep included


@pytest.mark.parametrize("sets", [
    {"security.tls.existingSecret": "cert", "security.auth.existingSecret": "tokens",
     "security.internal.existingSecret": "shared",
     "redis.enabled": False, "externalRedis.url": "rediss://r.example:6380/1", "externalRedis.existingSecret": "pw",
     "externalRedis.caSecret": "ca", "metrics.serviceMonitor.enabled": True, "ray.auth.secretName": "ray-token",
     "upgradeStrategy.type": "None", "podDisruptionBudget.maxUnavailable": 1, "serve.proxyLocation": "EveryNode"},
    {"security.auth.enabled": False, "ray.auth.enabled": False, "ray.gcsFaultTolerance.enabled": False,
     "networkPolicy.egress.enabled": False, "rayPods.readOnlyRootFilesystem": False, "service.httpPort": None,
     "metrics.grafanaDashboard.enabled": False, "podDisruptionBudget.enabled": False},
], ids=["everything on", "everything off"])
def test_combinations_should_render_valid_resources(helm_bin, render, crds, sets):
    args = ["lint", "--strict", str(CHART_DIR)]
    for key, value in sets.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    assert "0 chart(s) failed" in run_helm(helm_bin, *args)
    docs = render((), **sets)
    assert schema_errors(view.rayservice(docs), crd_schema(RAYSERVICE_CRD)) == []
    from deploy_helpers import sub_schema

    cluster_crd = crd_schema("ray.io_rayclusters.yaml")
    pod_schema = sub_schema(cluster_crd, "spec", "headGroupSpec", "template", "spec")
    for pod in docs.of_kind("Pod"):
        assert schema_errors(pod["spec"], pod_schema) == []
    for policy in docs.of_kind("NetworkPolicy"):
        for kind in ("ingress", "egress"):
            rule_schema = sub_schema(cluster_crd, "spec", "networkPolicy", "head", f"{kind}Rules", "[]")
            for rule in policy["spec"].get(kind, []):
                assert schema_errors(rule, rule_schema) == []
    from specdec.config.config import load_config

    load_config(overrides=_args(docs))
