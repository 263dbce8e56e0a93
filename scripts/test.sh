#!/usr/bin/env bash
# The test command: installs what is missing, builds, fuzzes each input parser for a bounded time
# (FUZZ_SECONDS, default 30 s each; 0 skips), then runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests also need PyTorch (Debian's python3-torch): a trained checkpoint is loaded into
# torch.nn modules and scored there (tests/e2e_test.cc, scripts/pytorch_eval.py).
STOKER_EXTRA_PACKAGES="python3-torch ${STOKER_EXTRA_PACKAGES:-}" scripts/setup.sh
fuzz_seconds=${FUZZ_SECONDS:-30}
if ((fuzz_seconds > 0)); then
  scripts/fuzz.sh "$fuzz_seconds"
fi
cd build
ctest --output-on-failure --timeout 600 "$@"
