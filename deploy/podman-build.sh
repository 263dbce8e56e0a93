#!/usr/bin/env bash
# Builds the deployment's images with podman, as `docker compose build` would with Docker:
# stoker-server, the worker (stoker-worker-cpu; --gpu: stoker-worker with NVIDIA's CUDA packages)
# and stoker-prometheus (Prometheus from Debian's package, for docker-compose.debian-prometheus.yml).
#
#   deploy/podman-build.sh [--gpu] [--no-prometheus]     (JOBS=N bounds the compile jobs)
#
# Why not `docker-compose build` through podman's socket: docker-compose 1.29 sends the whole
# repository as the build context (it knows only a root .dockerignore, not the per-Dockerfile
# ignore files), local build trees included. podman reads the ignore file given here, builds in
# Docker's image format (podman's default OCI format drops HEALTHCHECK) and uses chroot isolation
# (deploy/podman-setup.sh says why). The images get the names the compose files use, so
# `docker-compose up --no-build` (or podman-compose) starts them.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=0 prometheus=1
while (($#)); do
  case "$1" in
    --gpu) gpu=1 ;;
    --no-prometheus) prometheus=0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "podman-build: unknown argument $1 (--gpu, --no-prometheus)" >&2; exit 2 ;;
  esac
  shift
done
command -v podman >/dev/null || { echo "podman-build: podman is not installed" >&2; exit 1; }
common=(--format docker --isolation "${STOKER_BUILD_ISOLATION:-chroot}" --build-arg "JOBS=${JOBS:-}")
build() {  # NAME DOCKERFILE CONTEXT [ARGS...]
  local name=$1 dockerfile=$2 context=$3 start=$SECONDS
  shift 3
  echo "podman-build: $name"
  podman build "${common[@]}" "$@" -f "$dockerfile" -t "$name" "$context"
  echo "podman-build: $name built in $((SECONDS - start)) s"
}
build stoker-server deploy/Dockerfile.server . --ignorefile deploy/Dockerfile.server.dockerignore
if ((gpu)); then
  build stoker-worker deploy/Dockerfile.worker . --ignorefile deploy/Dockerfile.worker.dockerignore
else
  build stoker-worker-cpu deploy/Dockerfile.worker . \
    --ignorefile deploy/Dockerfile.worker.dockerignore --build-arg CUDA_REPO=
fi
if ((prometheus)); then
  build stoker-prometheus deploy/prometheus/Dockerfile deploy/prometheus
fi
