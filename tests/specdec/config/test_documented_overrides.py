"""Every configuration override the project documents validates, and everything a server
builds from it at start-up (without models, Ray or Redis) builds: a config that validates
starts. And the schema itself refuses, naming the key, what those objects would refuse."""

from pathlib import Path

import pytest
import yaml

from specdec.config.config import ConfigError, load_config
from specdec.wiring.startup_check import check_startup

ROOT = Path(__file__).resolve().parents[3]

#: override files: each is documented as something to pass to --config / as the app's args
OVERRIDE_FILES = sorted(ROOT.glob("configs/*.yaml")) + [ROOT / "cluster/specdec-gpu.yaml"]

#: overrides the README, docs/ and configs/default.yaml's comments describe, each where it is described
DOCUMENTED = {
    "README: the operator's QPS override": {"load_monitor": {"disable_qps": 3.0, "enable_qps": 1.0}},
    "default.yaml: the override with in-flight thresholds": {"load_monitor": {
        "disable_qps": 3.0, "enable_qps": 1.0, "disable_in_flight": 64, "enable_in_flight": 32}},
    "README: load_monitor.enabled false fixes γ": {"load_monitor": {"enabled": False}},
    "README: the override with the monitor off": {"load_monitor": {
        "enabled": False, "disable_qps": 3.0, "enable_qps": 0.0}},
    "default.yaml: the tail bound": {"load_monitor": {"max_round_ratio": 1.0}},
    "default.yaml: exploration off": {"load_monitor": {"explore_interval_s": 0.0}},
    "default.yaml: the request's own acceptance only": {"load_monitor": {"prior_tokens": 0.0}},
    "default.yaml: a short window": {"load_monitor": {"window_s": 1.0}},
    "README: overlap off": {"speculation": {"overlap": False}},
    "default.yaml: a request's γ up to 32": {"speculation": {"gamma_limit": 32}},
    "README: secure.yaml": {"security": {"api_tokens_file": "tokens", "tls_cert_file": "cert.pem",
                                         "tls_key_file": "key.pem"}},
    "README: --tensor-parallel-size 2, --port, --http-port": {"serving": {
        "tensor_parallel_size": 2, "port": 50052, "http_port": 8001}},
    "default.yaml: workers never released": {"serving": {"idle_release_s": 0.0}},
    "deploy.md: GPU workers": {"serving": {"target_num_gpus": 1, "draft_num_gpus": 1, "distributed_backend": "nccl"}},
}


def _helm_config(values_file: Path) -> dict:
    """The chart's `specdec.config` plus what the chart sets itself (the ports, security)."""
    config = dict(yaml.safe_load(values_file.read_text())["specdec"]["config"])
    serving = {**config.get("serving", {}), "port": 50051, "http_port": 8000}
    return {**config, "serving": serving, "security": {"api_tokens_file": "/etc/specdec/tokens"}}


def _documented() -> list[tuple[str, dict]]:
    cases = [(str(path.relative_to(ROOT)), yaml.safe_load(path.read_text()) or {}) for path in OVERRIDE_FILES]
    cases += [(f"helm {path.name}", _helm_config(path))
              for path in (ROOT / "helm/specdec/values.yaml", ROOT / "helm/specdec/ci/ci-values.yaml")]
    serve_config = yaml.safe_load((ROOT / "cluster/serve-config.yaml").read_text())
    cases += [("cluster/serve-config.yaml args", app["args"]) for app in serve_config["applications"]]
    return cases + list(DOCUMENTED.items())


@pytest.mark.parametrize("where, override", _documented(), ids=[name for name, _ in _documented()])
def test_a_documented_override_validates_and_builds_what_a_server_builds(where, override):
    config = load_config(overrides=override)
    check_startup(config)


# what the objects built at start-up refuse, and the key the schema names for it
REFUSED = [
    ({"load_monitor": {"disable_qps": 3.0, "enable_qps": 3.0}}, "load_monitor.enable_qps"),
    ({"load_monitor": {"disable_qps": 3.0}}, "load_monitor.enable_qps"),
    ({"load_monitor": {"disable_qps": 3.0, "enable_qps": 1.0, "disable_in_flight": 8, "enable_in_flight": 8}},
     "load_monitor.enable_in_flight"),
    ({"load_monitor": {"disable_qps": 3.0, "enable_qps": 1.0, "disable_in_flight": 8}},
     "load_monitor.enable_in_flight"),
    ({"load_monitor": {"disable_in_flight": 8, "enable_in_flight": 4}}, "load_monitor.disable_qps"),
    ({"load_monitor": {"fallback_gamma": 9}}, "load_monitor.fallback_gamma"),
    ({"load_monitor": {"bucket_s": 20.0}}, "load_monitor.bucket_s"),
    ({"load_monitor": {"cost_window_s": 5.0}}, "load_monitor.cost_window_s"),
    ({"serving": {"port": 8000}}, "serving.port"),
    ({"serving": {"target_num_cpus": 0}}, "serving.target_num_cpus"),
    ({"serving": {"distributed_backend": "nccl"}}, "serving.distributed_backend"),
    ({"generation": {"max_new_tokens": 5000}}, "generation.max_new_tokens"),
    ({"security": {"tls_cert_file": "cert.pem"}}, "security.tls_key_file"),
]


@pytest.mark.parametrize("override, key", REFUSED, ids=[key for _, key in REFUSED])
def test_the_schema_refuses_what_start_up_would_refuse_naming_the_key(override, key):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=override)
    message = str(refused.value)
    assert key in message and "\n" not in message


def test_defaults_leave_the_in_flight_thresholds_out_of_the_qps_override():
    monitor_config = load_config(overrides=DOCUMENTED["README: the operator's QPS override"]).load_monitor
    from specdec.policy.load_monitor import build_load_monitor

    switch = build_load_monitor(monitor_config, None, "r").policy.switch
    assert switch.update(qps=2.0, in_flight=10**6, now=0.0)  # in flight alone never turns it off
    assert not switch.update(qps=4.0, in_flight=0, now=10.0)
    assert switch.update(qps=0.5, in_flight=10**6, now=20.0)
