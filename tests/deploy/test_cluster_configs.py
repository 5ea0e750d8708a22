"""The `ray up` configs in cluster/ and the Serve config for `serve deploy`, checked offline with
Ray's own code: the launcher schema shipped with Ray (ray/autoscaler/ray-schema.json), Ray's
config preparation and validation (prepare_config, validate_config), `ray up`'s whole config
bootstrap (_bootstrap_config: everything before it connects to machines) where it needs no
cloud (local provider; AWS against moto's in-memory EC2/IAM), and
Ray Serve's ServeDeploySchema. What cannot run offline: the GCP provider bootstrap (project,
service account, SSH key metadata: Compute Engine API) and real instance launches.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deploy_helpers import CLUSTER_DIR, REPO_ROOT, import_or_missing, uncommented_keys  # registered by conftest.py

ray = import_or_missing("ray", "ray is not installed")
from ray.autoscaler._private.util import prepare_config, validate_config  # noqa: E402

RAY_SCHEMA = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
ALL_YAML = sorted(CLUSTER_DIR.glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


LAUNCHER_CONFIGS = [p for p in ALL_YAML if "provider" in _load(p)]
CLOUD_CONFIGS = [p for p in LAUNCHER_CONFIGS if _load(p)["provider"]["type"] in ("aws", "gcp")]
SERVE_CONFIG = CLUSTER_DIR / "serve-config.yaml"
SPECDEC_GPU_CONFIG = CLUSTER_DIR / "specdec-gpu.yaml"


def _ids(paths):
    return [p.name for p in paths]


@pytest.fixture(scope="module")
def ray_schema() -> dict[str, Any]:
    return json.loads(RAY_SCHEMA.read_text())


def _prepared(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does before talking to any provider: defaults, merged setup commands,
    per-type min/max workers, then the launcher's validation."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def _head_and_workers(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    return head, {name: t for name, t in types.items() if name != config["head_node_type"]}


def _grpc_servicer_functions_of_router() -> list[str]:
    """GRPC_SERVICER_FUNCTIONS from actors/router.py, read without importing Ray Serve."""
    tree = ast.parse((REPO_ROOT / "actors" / "router.py").read_text())
    for node in ast.walk(tree):
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == "GRPC_SERVICER_FUNCTIONS" for t in targets) and node.value is not None:
            return ast.literal_eval(node.value)
    pytest.fail("actors/router.py defines no GRPC_SERVICER_FUNCTIONS")


# --------------------------------------------------------------------------- the ladder


def test_the_ladder_has_a_local_an_aws_and_a_gcp_launcher_config():
    providers = {p.name: _load(p)["provider"]["type"] for p in LAUNCHER_CONFIGS}
    assert providers == {"local.yaml": "local", "aws-gpu.yaml": "aws", "gcp-gpu.yaml": "gcp"}


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=_ids(LAUNCHER_CONFIGS))
def test_launcher_config_validates_against_rays_own_schema(path, ray_schema):
    jsonschema.validate(_load(path), ray_schema)


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=_ids(LAUNCHER_CONFIGS))
def test_launcher_config_passes_rays_preparation_and_validation(path):
    prepared = _prepared(_load(path))
    assert prepared["head_node_type"] in prepared["available_node_types"]
    # the package install reaches the head (Serve's proxy imports the stubs there) and workers
    for commands in (prepared["head_setup_commands"], prepared["worker_setup_commands"]):
        assert any("specdec-dist/specdec-" in c for c in commands)


def test_local_config_passes_the_whole_ray_up_bootstrap_offline():
    from ray.autoscaler._private.commands import _bootstrap_config

    resolved = _bootstrap_config(_load(CLUSTER_DIR / "local.yaml"), no_config_cache=True)
    (node_type,) = resolved["available_node_types"].values()
    assert node_type["min_workers"] == node_type["max_workers"] == 2  # both worker_ips join


def test_aws_config_passes_the_whole_ray_up_bootstrap_against_moto(tmp_path, monkeypatch):
    """IAM role and instance profile, key pair, subnets, the security group with the gRPC rule,
    and resource auto-detection from EC2's instance-type catalogue, all against moto's fake AWS."""
    moto = import_or_missing("moto", "moto (in-memory AWS) is not installed")
    import ray.autoscaler._private.aws.config as aws_config
    from ray.autoscaler._private.commands import _bootstrap_config

    monkeypatch.setenv("HOME", str(tmp_path))  # the generated key pair lands here
    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2",
                       "MOTO_IAM_LOAD_MANAGED_POLICIES": "true"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setattr(aws_config.time, "sleep", lambda _s: None)  # IAM propagation waits
    config = _load(CLUSTER_DIR / "aws-gpu.yaml")
    with moto.mock_aws():
        resolved = _bootstrap_config(copy.deepcopy(config), no_config_cache=True)
    types = resolved["available_node_types"]
    for name, node_type in types.items():
        assert node_type["node_config"]["SecurityGroupIds"], name
        assert node_type["node_config"]["SubnetIds"], name
        # what we declare agrees with what EC2's catalogue says the instance type has
        assert node_type["resources"]["GPU"] == config["available_node_types"][name]["resources"]["GPU"], name
    head, _ = _head_and_workers(resolved)
    assert head["resources"]["GPU"] == 0
    assert (tmp_path / ".ssh").is_dir()


def test_aws_node_configs_are_valid_run_instances_requests():
    """Each node_config is what Ray passes to EC2 RunInstances: check it against botocore's
    model of that API (unknown or mistyped parameters fail), and the security-group rule
    against AuthorizeSecurityGroupIngress."""
    botocore_session = import_or_missing("botocore.session", "botocore is not installed")
    from botocore.validate import ParamValidator

    ec2 = botocore_session.get_session().get_service_model("ec2")
    config = _load(CLUSTER_DIR / "aws-gpu.yaml")
    for name, node_type in config["available_node_types"].items():
        params = dict(node_type["node_config"], MinCount=1, MaxCount=1)
        report = ParamValidator().validate(params, ec2.operation_model("RunInstances").input_shape)
        assert not report.has_errors(), f"{name}: {report.generate_report()}"
        assert params["InstanceType"] in ec2.shape_for("InstanceType").enum, name
    rules = {"GroupId": "sg-0", "IpPermissions": config["provider"]["security_group"]["IpPermissions"]}
    report = ParamValidator().validate(rules, ec2.operation_model("AuthorizeSecurityGroupIngress").input_shape)
    assert not report.has_errors(), report.generate_report()


# --------------------------------------------------------------------------- broken configs fail


BROKEN = {
    "misspelled top-level key": (lambda c: c.__setitem__("max_worker", 2), jsonschema.ValidationError),
    "node type without resources": (
        lambda c: next(iter(c["available_node_types"].values())).pop("resources"), jsonschema.ValidationError),
    "GPU count as text": (
        lambda c: next(iter(c["available_node_types"].values()))["resources"].__setitem__("GPU", "four"),
        jsonschema.ValidationError),
    "unknown key in a node type": (
        lambda c: next(iter(c["available_node_types"].values())).__setitem__("min_worker", 1),
        jsonschema.ValidationError),
    "head type that does not exist": (lambda c: c.__setitem__("head_node_type", "nope"), ValueError),
    "more min_workers than max_workers": (lambda c: c.__setitem__("max_workers", 1), ValueError),
}


@pytest.mark.parametrize("path", CLOUD_CONFIGS, ids=_ids(CLOUD_CONFIGS))
@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_a_broken_cloud_config_is_rejected(path, breakage, ray_schema):
    mutate, error = BROKEN[breakage]
    config = _load(path)
    mutate(config)
    with pytest.raises(error):
        jsonschema.validate(config, ray_schema)
        _prepared(config)


@pytest.mark.parametrize("breakage", ["no worker_ips", "node types on a local cluster", "misspelled key"])
def test_a_broken_local_config_is_rejected(breakage, ray_schema):
    config = _load(CLUSTER_DIR / "local.yaml")
    if breakage == "no worker_ips":
        del config["provider"]["worker_ips"]
    elif breakage == "node types on a local cluster":
        config["available_node_types"] = {"x": {"resources": {}, "node_config": {}}}
        config["head_node_type"] = "x"
    else:
        config["setup_command"] = []
    # ValidationError, or the launcher's abort (ClickException): either refusal will do
    with pytest.raises(Exception):  # noqa: B017
        jsonschema.validate(config, ray_schema)
        _prepared(config)


def test_a_broken_aws_node_config_is_rejected_by_the_ec2_model():
    botocore_session = import_or_missing("botocore.session", "botocore is not installed")
    from botocore.validate import ParamValidator

    ec2 = botocore_session.get_session().get_service_model("ec2")
    node_config = dict(_load(CLUSTER_DIR / "aws-gpu.yaml")["available_node_types"]["ray.worker.target"]["node_config"])
    node_config["InstanceTyp"] = node_config.pop("InstanceType")
    report = ParamValidator().validate(dict(node_config, MinCount=1, MaxCount=1),
                                       ec2.operation_model("RunInstances").input_shape)
    assert report.has_errors()


# --------------------------------------------------------------------------- what the configs say


@pytest.mark.parametrize("path", ALL_YAML, ids=_ids(ALL_YAML))
def test_every_key_in_cluster_yaml_has_a_comment(path):
    assert uncommented_keys(path.read_text()) == []


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=_ids(LAUNCHER_CONFIGS))
def test_every_ray_start_gives_serve_the_stack_environment_specdec_serve_gives(path):
    from actors.stack_environment import STACK_ENVIRONMENT

    config = _load(path)
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2
    for command in starts:
        assert all(f"{name}={value} " in command for name, value in STACK_ENVIRONMENT.items()), command


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=_ids(LAUNCHER_CONFIGS))
def test_the_head_runs_no_model(path):
    config = _load(path)
    start = " ".join(config["head_start_ray_commands"])
    assert "--num-gpus=0" in start
    if "available_node_types" in config:
        head, _ = _head_and_workers(config)
        assert head["resources"]["GPU"] == 0


@pytest.mark.parametrize("path", CLOUD_CONFIGS, ids=_ids(CLOUD_CONFIGS))
def test_gpu_worker_types_fit_the_tensor_parallel_target_and_the_draft(path):
    serving = _load(SERVE_CONFIG)["applications"][0]["args"]["serving"]
    _, workers = _head_and_workers(_load(path))
    target = [t for n, t in workers.items() if "target" in n]
    draft = [t for n, t in workers.items() if "draft" in n]
    assert len(target) == len(draft) == 1, sorted(workers)
    # the target's ranks are packed onto one node (STRICT_PACK): that node needs them all
    assert target[0]["resources"]["GPU"] >= serving["tensor_parallel_size"] * serving["target_num_gpus"]
    assert draft[0]["resources"]["GPU"] >= serving["draft_num_gpus"]
    assert target[0]["min_workers"] >= 1 and draft[0]["min_workers"] >= 1


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=_ids(LAUNCHER_CONFIGS))
def test_setup_installs_the_built_package_not_the_working_directory(path):
    config = _load(path)
    mounts = config.get("file_mounts", {})
    sources = {os.path.normpath(v) for v in mounts.values()}
    assert "." not in sources and os.path.normpath(str(REPO_ROOT)) not in sources
    assert mounts.get("~/specdec-dist") == "./dist"
    commands = config["setup_commands"]
    torch_at = next(i for i, c in enumerate(commands) if re.search(r"pip install .*torch==", c))
    package_at = next(i for i, c in enumerate(commands) if "specdec-dist/specdec-" in c)
    assert torch_at < package_at, "torch must be installed before the package"


def test_every_config_pins_the_same_ray_version():
    versions = set()
    for path in LAUNCHER_CONFIGS:
        text = path.read_text()
        versions |= set(re.findall(r"ray\[[a-z,]+\]==([0-9.]+)", text))
        versions |= set(re.findall(r"rayproject/ray:([0-9.]+)-", text))
    assert len(versions) == 1, versions


def test_gcp_gpu_vms_terminate_on_host_maintenance_and_use_label_safe_names():
    config = _load(CLUSTER_DIR / "gcp-gpu.yaml")
    _, workers = _head_and_workers(config)
    for name in config["available_node_types"]:
        assert re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", name), f"{name} is not a valid GCE label value"
    for name, node_type in workers.items():
        assert node_type["node_config"]["scheduling"]["onHostMaintenance"] == "TERMINATE", name


# --------------------------------------------------------------------------- serve deploy


def test_serve_config_validates_with_ray_serves_schema():
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(_load(SERVE_CONFIG))
    assert [app.import_path for app in schema.applications] == ["actors.app:build_app"]


def _unknown_serve_keys(data: dict[str, Any]) -> list[str]:
    """ServeDeploySchema ignores unknown keys; a typo would silently do nothing. List them."""
    from ray.serve.schema import (DeploymentSchema, HTTPOptionsSchema, ServeApplicationSchema,
                                  ServeDeploySchema, gRPCOptionsSchema)

    def extra(model, mapping, where):
        return [f"{where}.{k}" for k in mapping if k not in model.model_fields]

    out = extra(ServeDeploySchema, data, "<root>")
    out += extra(HTTPOptionsSchema, data.get("http_options", {}), "http_options")
    out += extra(gRPCOptionsSchema, data.get("grpc_options", {}), "grpc_options")
    for i, app in enumerate(data.get("applications", [])):
        out += extra(ServeApplicationSchema, app, f"applications[{i}]")
        for j, dep in enumerate(app.get("deployments", [])):
            out += extra(DeploymentSchema, dep, f"applications[{i}].deployments[{j}]")
    return out


def test_serve_config_has_no_keys_serve_would_ignore():
    assert _unknown_serve_keys(_load(SERVE_CONFIG)) == []
    broken = _load(SERVE_CONFIG)
    broken["grpc_options"]["servicer_functions"] = []
    assert _unknown_serve_keys(broken) == ["grpc_options.servicer_functions"]


def test_serve_config_grpc_options_match_the_router():
    config = _load(SERVE_CONFIG)
    assert config["grpc_options"]["grpc_servicer_functions"] == _grpc_servicer_functions_of_router()
    assert config["grpc_options"]["port"] == config["applications"][0]["args"]["serving"]["port"] == 50051
    # the HTTP API: Serve's HTTP proxy on every interface of the head, on serving.http_port
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000}
    assert config["applications"][0]["args"]["serving"]["http_port"] == 8000
    assert config["proxy_location"] == "HeadOnly"
    # without a route prefix the app is no endpoint of the proxies (gRPC included)
    assert config["applications"][0]["route_prefix"] == "/"  # OpenAI paths at the HTTP root, as `specdec serve`


def test_serve_args_are_a_valid_specdec_config_equal_to_specdec_gpu_yaml():
    from specdec.config.config import load_config

    args = _load(SERVE_CONFIG)["applications"][0]["args"]
    load_config(overrides=args)  # unknown keys or bad values raise
    load_config(SPECDEC_GPU_CONFIG)
    without_port = copy.deepcopy(args)
    del without_port["serving"]["port"]
    assert without_port == _load(SPECDEC_GPU_CONFIG)


def test_serve_import_path_names_an_application_builder():
    """`serve deploy` and KubeRay import actors.app:build_app and call it with `args`."""
    module, _, attribute = _load(SERVE_CONFIG)["applications"][0]["import_path"].partition(":")
    tree = ast.parse((REPO_ROOT / (module.replace(".", "/") + ".py")).read_text())
    builders = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == attribute]
    assert builders, f"{module} defines no {attribute}(args) application builder"
    assert len(builders[0].args.args) >= 1, f"{attribute} must take the args dict"


def test_gpu_configs_size_the_cache_for_the_model_not_1024_tokens():
    """Qwen2.5-14B's context is 32768 tokens: the GPU configs set a realistic cache length."""
    cache = _load(SPECDEC_GPU_CONFIG)["cache"]
    assert 8192 <= cache["max_seq_len"] <= 32768 and cache["num_slots"] >= 8
    assert _load(SERVE_CONFIG)["applications"][0]["args"]["cache"] == cache


def test_aws_security_group_opens_the_grpc_and_http_ports_to_a_documented_range_only():
    rules = _load(CLUSTER_DIR / "aws-gpu.yaml")["provider"]["security_group"]["IpPermissions"]
    assert sorted(r["FromPort"] for r in rules) == [8000, 50051]
    for rule in rules:
        assert rule["FromPort"] == rule["ToPort"]
        assert all(r["CidrIp"] != "0.0.0.0/0" for r in rule["IpRanges"])
