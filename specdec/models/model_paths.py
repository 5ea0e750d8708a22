"""Where model names point: 'bundled:NAME' is the tiny pair shipped inside the package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BUNDLED_DIR = Path(__file__).resolve().parents[1] / "bundled"
BUNDLED_PREFIX = "bundled:"


def resolve_model_path(name: str) -> str:
    """'bundled:target' -> the package's bundled directory; anything else is returned as is
    (a local directory or a hub id, resolved by the loader)."""
    if not name.startswith(BUNDLED_PREFIX):
        return name
    path = BUNDLED_DIR / name[len(BUNDLED_PREFIX) :]
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no bundled model {name!r} (looked in {path})")
    return str(path)


def bundled_prompts() -> list[str]:
    """Held-out code prompts saved with the bundled pair (tests and benchmarks use them)."""
    import json

    return json.loads((BUNDLED_DIR / "prompts.json").read_text())


def check_model_path(name: str, key: str) -> None:
    """Fail fast, before Ray or any weights load, on a model that cannot be there: a missing
    bundled model, or a local path (absolute, ./, ~, or existing) that is not a directory
    with config.json. Hub ids ('org/name') are left to the loader (cache or download).
    Raises ValueError naming the config key. An emulated model's profile must load."""
    if name.startswith("emulated:"):
        from specdec.models.emulated_profile import load_profile, parse_emulated_name  # torch: only when named

        try:
            load_profile(parse_emulated_name(name).profile)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        return
    try:
        resolved = resolve_model_path(name)
    except FileNotFoundError as exc:
        raise ValueError(f"{key}: {exc}") from None
    path = Path(resolved).expanduser()
    local = path.exists() or resolved.startswith(("/", ".", "~")) or resolved.count("/") > 1
    if not local:
        return
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise ValueError(f"{key}: model directory {name!r} {problem}")
    if not (path / "config.json").is_file():
        raise ValueError(f"{key}: {name!r} is not a model directory (no config.json in it)")


def check_model_paths(models: Any, draft_needed: bool) -> None:
    """check_model_path for the target, and for the draft when a draft is loaded."""
    check_model_path(models.target, "models.target")
    if draft_needed:
        check_model_path(models.draft, "models.draft")
