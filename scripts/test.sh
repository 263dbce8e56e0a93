#!/usr/bin/env bash
# The test command: installs what is missing, builds, fuzzes each input parser for a bounded time
# (FUZZ_SECONDS, default 20 s each; 0 skips), then runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
fuzz_seconds=${FUZZ_SECONDS:-30}
if ((fuzz_seconds > 0)); then
  scripts/fuzz.sh "$fuzz_seconds"
fi
cd build
ctest --output-on-failure --timeout 600 "$@"
