#!/bin/sh
# NVIDIA's CUDA packages for the worker image, from the repository in $CUDA_REPO; an empty
# CUDA_REPO makes a CPU worker (nothing is fetched, the trainer is built without the cuda backend).
# The GPU and CPU images run the same Dockerfile steps: only this package source differs.
#
# Usage: cuda-packages.sh build     (build stage: nvcc, cudart, cuBLAS and cuDNN development files)
#        cuda-packages.sh runtime   (runtime stage: only configures the repository, so that the
#                                    NVIDIA packages in runtime-packages.txt can be installed)
# CUDA_PKG (e.g. 13-0) and CUDNN_PKG (e.g. cuda-13) name the package versions.
set -eu
mode=${1:?usage: cuda-packages.sh build|runtime}
if [ -z "${CUDA_REPO:-}" ]; then
  echo "cuda-packages: CUDA_REPO is empty: CPU worker, no NVIDIA packages"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends ca-certificates curl
curl -fsSLo /tmp/cuda-keyring.deb "$CUDA_REPO/cuda-keyring_1.1-1_all.deb"
dpkg -i /tmp/cuda-keyring.deb
rm -f /tmp/cuda-keyring.deb
apt-get update
case "$mode" in
  build)
    apt-get install -y --no-install-recommends \
      "cuda-nvcc-$CUDA_PKG" "cuda-cudart-dev-$CUDA_PKG" "libcublas-dev-$CUDA_PKG" \
      "libcudnn9-dev-$CUDNN_PKG"
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    ;;
  runtime) ;;  # the lists stay for the install that follows; that step removes them
  *) echo "cuda-packages: unknown mode $mode (build|runtime)" >&2; exit 2 ;;
esac
