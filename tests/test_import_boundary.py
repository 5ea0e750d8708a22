"""The core package is pure: plain Python and torch, usable in-process; and imports point one way.

Ray, gRPC and Redis belong to the shells (actors, services, stores) that wire the core up.
The packages form layers, and a module imports only layers below its own (LAYERS); inside
`specdec` and `specdec_rpc`, the rooms (subpackages) are layered the same way (ROOMS).
"""

import ast
from pathlib import Path

import specdec

FORBIDDEN = {"ray", "grpc", "grpc_tools", "grpc_health", "grpc_reflection", "redis"}
CORE_DIR = Path(specdec.__file__).resolve().parent
REPO = CORE_DIR.parent

# Outer -> inner: a module may import its own package and the layers after its own.
# Packages in one layer are siblings: none imports another.
LAYERS = [
    ("specdec_cli",),  # the `specdec` command
    ("actors",),  # Ray actors and Serve deployments
    ("specdec_http", "specdec_rpc", "specdec_redis"),  # the protocol and store shells
    ("specdec_metrics",),  # Prometheus metrics of the router and the workers
    ("specdec",),  # the pure core
]
# Inside a package, outer -> inner: a room may import itself and the rooms after it.
# Every module of these packages lives in a room.
ROOMS = {
    "specdec": ["wiring", "serving", "round", "policy", "requests", "config", "verifiers", "proposers", "models",
                "sampling"],
    "specdec_rpc": ["public", "worker", "v1"],
}
# Imports that go up a layer today, each with why it is still there. Remove an entry once it is fixed.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


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


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_project_modules(path: Path) -> set[str]:
    """The project modules `path` imports (`from pkg import module` names the module)."""
    tops = {p for layer in LAYERS for p in layer}
    own = module_name(path).split(".")
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = own if path.name == "__init__.py" else own[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base)
    return {n for n in names if n.split(".")[0] in tops}


def rank(module: str) -> tuple[int, int | None]:
    """(the package's layer, the room's place inside the package; None outside every room)."""
    parts = module.split(".")
    layer = next(i for i, packages in enumerate(LAYERS) if parts[0] in packages)
    rooms = ROOMS.get(parts[0], [])
    room = rooms.index(parts[1]) if len(parts) > 2 and parts[1] in rooms else None
    return layer, room


def goes_up(importer: str, imported: str) -> bool:
    """Whether `importer` reaches a layer (or a room) above its own, or a sibling package."""
    (layer, room), (other_layer, other_room) = rank(importer), rank(imported)
    if importer.split(".")[0] != imported.split(".")[0]:
        return other_layer <= layer
    return room is not None and other_room is not None and other_room < room


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for layer in LAYERS:
        for package in layer:
            for path in (REPO / package).rglob("*.py"):
                importer = module_name(path)
                found |= {(importer, m) for m in imported_project_modules(path) if goes_up(importer, m)}
    return found


def test_every_package_has_a_layer():
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages == {p for layer in LAYERS for p in layer}


def test_imports_point_down_the_layers():
    offenders = sorted(upward_imports() - ALLOWED_UPWARD)
    assert not offenders, f"imports that go up a layer (see LAYERS / ROOMS): {offenders}"


def test_the_allowed_upward_imports_still_exist():
    stale = ALLOWED_UPWARD - upward_imports()
    assert not stale, f"fixed: remove these from ALLOWED_UPWARD: {sorted(stale)}"


def test_every_module_of_a_roomed_package_lives_in_a_room():
    loose = sorted(str(path.relative_to(REPO)) for package in ROOMS for path in (REPO / package).glob("*.py")
                   if path.name != "__init__.py")
    assert not loose, f"place these in a room (see ROOMS), or add a room: {loose}"


def test_every_room_is_listed():
    rooms = {f"{package}.{p.parent.name}" for package in ROOMS for p in (REPO / package).glob("*/__init__.py")}
    assert rooms == {f"{package}.{room}" for package, names in ROOMS.items() for room in names}


def test_the_layer_check_sees_upward_sideways_and_room_order():
    assert goes_up("specdec.round.engine", "actors.router")
    assert goes_up("specdec_http.openai_api", "specdec_rpc.public.client")  # siblings
    assert goes_up("specdec.round.engine", "specdec.serving.frontend")
    assert goes_up("specdec_rpc.worker.remote_verifier", "specdec_rpc.public.status_codes")
    assert not goes_up("actors.router", "specdec.round.engine")
    assert not goes_up("specdec.serving.frontend", "specdec.round.engine")
    assert not goes_up("specdec.round.engine", "specdec.round.round_planner")
