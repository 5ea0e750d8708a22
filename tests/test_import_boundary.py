"""The core package is pure: plain Python and torch, usable in-process.

Ray, gRPC and Redis belong to the shells (actors, services, stores) that wire the core up.
"""

import ast
from pathlib import Path

import specdec

FORBIDDEN = {"ray", "grpc", "grpc_tools", "grpc_health", "grpc_reflection", "redis"}
CORE_DIR = Path(specdec.__file__).resolve().parent


def imported_top_level_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_package_never_imports_ray_grpc_or_redis():
    offenders = {
        str(path.relative_to(CORE_DIR)): sorted(imported_top_level_modules(path) & FORBIDDEN)
        for path in CORE_DIR.rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"core modules import shell-only packages: {offenders}"


def test_the_boundary_check_sees_every_kind_of_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import ray.serve\nfrom redis import Redis\ndef f():\n    import grpc\n")
    assert imported_top_level_modules(sample) == {"ray", "redis", "grpc"}
