# The two commands a newcomer needs (each does all set-up first):
#   make demo   - serve the bundled tiny model pair on local Ray (draft + target actors, gRPC
#                 router) and call it: a streamed generation, the JSON result, the live stats
#   make test   - run the whole test suite (what CI runs)
# On a machine whose pip would pull CUDA wheels for torch, choose the CPU build with e.g.
#   make test TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
TORCH_PIP_ARGS ?=
PIP := $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: setup redis-server demo test bench

setup:
	@command -v redis-server >/dev/null 2>&1 || $(MAKE) --no-print-directory redis-server
	$(PIP) $(TORCH_PIP_ARGS) "torch==2.13.0"
	# the gRPC stubs are generated at install by this environment's grpcio-tools (not an isolated
	# build's newest), so they never ask for a newer grpcio than the one installed beside them
	$(PIP) "setuptools>=68" wheel "grpcio-tools>=1.60"
	$(PIP) --no-build-isolation -e ".[test,bench]"

# The load monitor's shared store; the tests start their own redis-server on a free port.
redis-server:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	else \
		echo "note: install redis-server (e.g. sudo apt-get install redis-server) for the Redis tests"; \
	fi

demo: setup
	bash scripts/demo.sh

# The in-process tier (tests/specdec: no Ray, no servers) runs on two pytest-xdist workers, one
# torch thread each; everything that starts Ray, Serve, Redis or a server process runs after it,
# one test at a time. `python -m pytest` alone runs the same tests in one process.
test: setup
	$(PYTHON) -m pytest -n 2 --dist loadfile tests/specdec
	$(PYTHON) -m pytest --ignore=tests/specdec

bench: setup
	$(PYTHON) benchmarks/bench_core.py
	$(PYTHON) benchmarks/bench_serving.py
	$(PYTHON) benchmarks/bench_load.py
