"""Build hook: generate the gRPC Python stubs from protos/ (the .proto files are the source
of truth; generated files are never committed or edited). Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = ROOT / "protos"


def generate_stubs() -> None:
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={ROOT}",
            f"--grpc_python_out={ROOT}", f"--pyi_out={ROOT}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {protos}")


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
