# syntax=docker/dockerfile:1
# specdec server image: Ray (with Serve), torch and the specdec package with its generated gRPC
# stubs. The Helm chart (helm/specdec) runs it as the Ray head and worker containers.
#
# CPU (default):
#   docker build -t specdec:0.1.0 .
# CUDA: torch's CUDA wheels bundle the CUDA runtime, so the base stays python:*-slim and only
# the torch index changes; the nodes need the NVIDIA driver and container toolkit:
#   docker build -t specdec:0.1.0-cuda --build-arg TORCH_INDEX_URL=https://pypi.org/simple .
#   (or a specific CUDA build: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128,
#   pick a cuXXX that the index lists for TORCH_VERSION)
# A different base (Debian/Ubuntu with python3 >= 3.10 and its venv module, e.g. an
# nvidia/cuda runtime image with python3-venv installed) goes in with --build-arg BASE_IMAGE=...
#
# Build args:
#   BASE_IMAGE       image both stages start from                 (python:3.11-slim-bookworm)
#   TORCH_VERSION    torch installed before the package           (2.13.0)
#   TORCH_INDEX_URL  where torch comes from: CPU or CUDA builds   (https://download.pytorch.org/whl/cpu)
#   RAY_VERSION      Ray inside the image; the chart's ray.version must equal it (2.60.0)
#   SPECDEC_EXTRAS   extras of the package to install, e.g. "[redis]"   (none)

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- build: turn the source tree into a wheel (setup.py runs protoc here) ----
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN python3 -m pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime ----
FROM ${BASE_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG RAY_VERSION=2.60.0
ARG SPECDEC_EXTRAS=
ARG UID=1000

LABEL org.opencontainers.image.title="specdec" \
      org.opencontainers.image.description="Distributed lossless speculative decoding on Ray Serve (gRPC and HTTP)" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HOME=/home/specdec/.cache/huggingface

# wget: KubeRay's default liveness/readiness probes run it inside the Ray containers.
# (Distribution packages follow the base image's release; no per-package pins.)
# KubeRay starts Ray in a login shell (bash -lc), where /etc/profile resets PATH: the
# profile.d script puts the virtualenv back in front.
# hadolint ignore=DL3008,SC2016
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid "${UID}" --create-home --shell /bin/bash specdec \
    && python3 -m venv /opt/venv \
    && echo 'export PATH="/opt/venv/bin:$PATH"' > /etc/profile.d/specdec-venv.sh

# torch first, from the chosen index, so installing the package keeps this build.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY --from=build /wheels /wheels
RUN pip install "ray[default,serve]==${RAY_VERSION}" "$(ls /wheels/specdec-*.whl)${SPECDEC_EXTRAS}" \
    && rm -rf /wheels \
    && python3 -c "import specdec_rpc.v1.specdec_pb2_grpc, grpc_health.v1.health_pb2_grpc"

USER ${UID}
WORKDIR /home/specdec

# 50051 gRPC API (Ray Serve's gRPC proxy), 8000 HTTP API (Ray Serve's HTTP proxy),
# 6379 Ray GCS, 8265 Ray dashboard, 10001 Ray client, 8080 Prometheus metrics.
EXPOSE 50051 8000 6379 8265 10001 8080

# Ray pods get their command from KubeRay; standalone, the container prints the CLI help.
CMD ["specdec", "--help"]
