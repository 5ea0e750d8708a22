"""`specdec serve` closes its workers to everyone but its routers: starting its own Ray it
binds them to loopback and generates an internal secret when none is configured; joining a
running Ray it leaves both alone and says loudly that the workers are open."""

from specdec.config.config import load_config
from specdec_cli.local_workers import LOOPBACK, UNAUTHENTICATED_WARNING, secure_local_workers
from specdec_rpc.worker.internal_auth import SECRET_ENV, configured_secret


def test_starting_its_own_ray_it_binds_loopback_and_generates_a_secret_per_run():
    config = load_config()
    first, second = {}, {}
    secured = secure_local_workers(config, joining=False, environ=first, warn=_no_warning)
    secure_local_workers(config, joining=False, environ=second, warn=_no_warning)
    assert secured.serving.worker_host == LOOPBACK and config.serving.worker_host == ""
    assert len(first[SECRET_ENV]) >= 32 and first[SECRET_ENV] != second[SECRET_ENV]
    assert configured_secret(secured.security.internal_secret_file, first) == first[SECRET_ENV]


def test_a_configured_secret_and_interface_are_kept(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the-operators-secret\n")
    config = load_config(overrides={"serving": {"worker_host": "10.0.0.7"},
                                    "security": {"internal_secret_file": str(secret)}})
    environ = {}
    assert secure_local_workers(config, joining=False, environ=environ, warn=_no_warning) == config
    assert environ == {}
    from_env = {SECRET_ENV: "set-in-the-environment"}
    secure_local_workers(load_config(), joining=False, environ=from_env, warn=_no_warning)
    assert from_env == {SECRET_ENV: "set-in-the-environment"}


def test_joining_a_running_ray_without_a_secret_warns_and_changes_nothing():
    warnings, environ = [], {}
    config = load_config()
    assert secure_local_workers(config, joining=True, environ=environ, warn=warnings.append) == config
    assert environ == {} and warnings == [UNAUTHENTICATED_WARNING]


def _no_warning(line):
    raise AssertionError(f"unexpected warning: {line}")
