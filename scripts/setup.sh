#!/usr/bin/env bash
# Installs the Debian packages Stoker needs (only those missing) and builds it (Release) in build/.
# Usage: scripts/setup.sh            (idempotent; re-running only rebuilds what changed)
# STOKER_EXTRA_PACKAGES adds Debian packages to install (scripts/test.sh adds python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."

# libdnnl-dev's CMake config calls find_package(OpenCL REQUIRED), but the package only recommends
# the OpenCL headers and loader: with --no-install-recommends they must be named here.
packages=(
  cmake ninja-build g++ pkg-config ocl-icd-opencl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libsqlite3-dev libdnnl-dev libyaml-cpp-dev
  libcli11-dev zlib1g-dev nlohmann-json3-dev libssl-dev libjpeg62-turbo-dev libpng-dev libarchive-dev
  libgloo-dev libcpp-httplib-dev
  dataset-fashion-mnist
  prometheus docker-compose curl python3 openssl
)
read -r -a extra <<<"${STOKER_EXTRA_PACKAGES:-}"
packages+=("${extra[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
