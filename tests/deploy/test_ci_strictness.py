"""The deployment tests cannot pass silently under CI: a tool that cannot be fetched (helm,
hadolint), absent KubeRay CRDs or a missing test dependency skip locally but fail when CI=true."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from _pytest.outcomes import Failed, Skipped

from deploy_helpers import REPO_ROOT, import_or_missing, tool_missing, under_ci  # registered by conftest.py


@pytest.mark.parametrize("value, expected", [("true", True), ("1", True), ("TRUE", True), ("", False),
                                             ("false", False), ("0", False)])
def test_ci_is_detected_from_the_ci_variable(monkeypatch, value, expected):
    monkeypatch.setenv("CI", value)
    assert under_ci() is expected


def test_a_missing_tool_skips_locally(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(Skipped, match="helm binary unavailable"):
        tool_missing("helm binary unavailable")


def test_a_missing_tool_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed, match="CI=true"):
        tool_missing("helm binary unavailable")
    with pytest.raises(Failed, match="no_such_module_x"):
        import_or_missing("no_such_module_x")


def test_helm_fixture_fails_under_ci_when_helm_cannot_be_had(tmp_path):
    """End to end: a pytest run of the chart tests with an unusable helm fails under CI=true and
    skips without it."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(textwrap.dedent("""
        def test_needs_helm(helm_bin):
            pass
    """))
    conftest = REPO_ROOT / "tests" / "deploy" / "conftest.py"
    (tmp_path / "conftest.py").write_text(conftest.read_text().replace(
        'Path(__file__).with_name(f"{_name}.py")', f'Path({str(conftest.parent)!r}) / f"{{_name}}.py"'))
    base = {"PATH": "/usr/bin:/bin", "SPECDEC_HELM": str(tmp_path / "no-helm"), "HOME": str(tmp_path)}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(probe)]
    local = subprocess.run(args, env=base, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    ci = subprocess.run(args, env={**base, "CI": "true"}, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout + local.stderr
    assert ci.returncode == 1 and "1 error" in ci.stdout and "CI=true" in ci.stdout, ci.stdout + ci.stderr
