#!/usr/bin/env bash
# Packs the Debian build dependencies of the standalone GPU build (tests/gpu/CMakeLists.txt) into
# one archive, for GPU machines whose image has CUDA, CMake and g++ but none of Debian's -dev
# packages and no network (the nvidia-h200 kind): Abseil (headers, shared libraries, CMake
# config), GoogleTest/GoogleMock (static), oneDNN 2.6 and the OpenCL ICD loader it links.
# Run it on the Debian 12 development machine; check.sh unpacks the archive when the GPU machine's
# own packages are missing. The CMake configs are relocatable (they derive their prefix from
# their own location), so the archive keeps Debian's /usr layout under one folder.
#
#   tests/gpu/bundle_deps.sh [archive]   (default: build-gpu-deps/stoker-gpu-deps.tar.gz, ~15 MB)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ARCHIVE=${1:-$ROOT/build-gpu-deps/stoker-gpu-deps.tar.gz}
LIB=usr/lib/x86_64-linux-gnu
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

copy() {  # copy PATH... keeping the path under $STAGE (symlinks kept as links)
  for path in "$@"; do
    mkdir -p "$STAGE/$(dirname "${path#/}")"
    cp -a "$path" "$STAGE/${path#/}"
  done
}

copy /usr/include/absl /usr/include/gtest /usr/include/gmock /usr/include/oneapi /usr/include/CL
copy /usr/include/dnnl*.h /usr/include/dnnl*.hpp
copy /$LIB/cmake/absl /$LIB/cmake/GTest /$LIB/cmake/dnnl
copy /$LIB/libabsl_*.so* /$LIB/libgtest*.a /$LIB/libgmock*.a /$LIB/libdnnl.so* /$LIB/libOpenCL.so*
# What the archive was made from, for the log on the other side.
dpkg-query -W libabsl-dev libgtest-dev libgmock-dev libdnnl-dev ocl-icd-opencl-dev \
  opencl-c-headers >"$STAGE/VERSIONS" 2>/dev/null || true

mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$STAGE" -czf "$ARCHIVE" .
echo "wrote $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
