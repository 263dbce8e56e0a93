#!/usr/bin/env bash
# The test command: installs what is missing, builds, fuzzes each input parser for a bounded time
# (FUZZ_SECONDS, default 30 s each; 0 skips), then runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests also need PyTorch (Debian's python3-torch): a trained checkpoint is loaded into
# torch.nn modules and scored there (tests/e2e_test.cc, scripts/pytorch_eval.py); and torchvision
# with PIL, the reference the image decoder and transforms are checked against (data/image); and
# Chromium with its WebDriver, the real browser the web page is tested in (tests/web_e2e_test.cc).
STOKER_EXTRA_PACKAGES="python3-torch python3-torchvision python3-pil chromium chromium-driver ${STOKER_EXTRA_PACKAGES:-}" \
  scripts/setup.sh
# The standalone GPU build (tests/gpu, what tests/gpu/check.sh builds on a GPU machine) must
# compile and link here too, or it rots unseen; no device is needed. Skipped without nvcc.
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [[ -x "$nvcc" ]]; then
  echo "test.sh: building tests/gpu standalone in build-gpu-standalone"
  CUDACXX="$nvcc" cmake -S tests/gpu -B build-gpu-standalone -G Ninja \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-gpu-standalone -j"$(nproc)" --target cuda_conformance_test \
    cuda_network_test gpu_bench engine_test
else
  echo "test.sh: no nvcc: the standalone GPU build (tests/gpu) is skipped"
fi
fuzz_seconds=${FUZZ_SECONDS:-30}
if ((fuzz_seconds > 0)); then
  scripts/fuzz.sh "$fuzz_seconds"
fi
cd build
ctest --output-on-failure --timeout 600 "$@"
