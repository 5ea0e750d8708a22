"""The Helm chart's Redis, read as a specification: a Redis with a password from a Secret by
default (on stdin, never in argv or plain values), generated secrets that keep their values,
persistence, an external Redis (with TLS) instead, and none refused (rendered by the real helm
binary)."""

from __future__ import annotations


import pytest

import chart_views as view
from chart_views import RAYCLUSTER_CRD, RAYSERVICE_CRD, VALUES
from deploy_helpers import CHART_DIR, HelmError, crd_schema, run_helm, schema_errors, strip_source, sub_schema  # noqa: E501  registered by conftest.py



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
