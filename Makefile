# The two commands a newcomer needs (each does all set-up first):
#   make demo   - generate with speculative decoding on the bundled tiny model pair
#   make test   - run the whole test suite (what CI runs)
# On a machine whose pip would pull CUDA wheels for torch, choose the CPU build with e.g.
#   make test TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
TORCH_PIP_ARGS ?=
PIP := $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: setup demo test bench

setup:
	$(PIP) $(TORCH_PIP_ARGS) "torch==2.13.0"
	$(PIP) -e ".[test,bench]"

demo: setup
	specdec generate --prompt "def fibonacci(n):" --max-new-tokens 64 --json

test: setup
	$(PYTHON) -m pytest

bench: setup
	$(PYTHON) benchmarks/bench_core.py
