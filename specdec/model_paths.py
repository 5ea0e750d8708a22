"""Where model names point: 'bundled:NAME' is the tiny pair shipped inside the package."""

from __future__ import annotations

from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
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
