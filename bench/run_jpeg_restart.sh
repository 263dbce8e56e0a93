#!/usr/bin/env bash
# Restart-indexed JPEGs (issue 31): the cost of decoding a crop by where it lies (top, middle,
# bottom, RandomResizedCrop's boxes), on photo-like JPEGs (bench/images/make_jpegs.py, ~500 x 375,
# quality 90, 4:2:0) and on the same files with a restart marker every MCU row, as
# `stoker-dataset pack` stores them; plus the transcoding's time and bytes. Checks first that
# both files give the same pixels for every box.
# Usage: bench/run_jpeg_restart.sh [path/to/jpeg_crop_bench]
#   WORK (default /tmp/stoker-jpeg-restart-bench: the JPEGs, made once), COUNT (400), ROUNDS (5)
#   SMOKE=1: 16 images, one round; fails unless every box decoded alike and without error.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench jpeg_crop_bench "${1:-}"
count=${COUNT:-400} rounds=${ROUNDS:-5}
if [[ "$smoke" == 1 ]]; then
  count=16 rounds=1
  work="${WORK:-/tmp/stoker-jpeg-restart-smoke-$$}"
  [[ -n "${WORK:-}" ]] || trap 'rm -rf "$work"' EXIT
else
  work="${WORK:-/tmp/stoker-jpeg-restart-bench}"
fi
jpegs="$work/jpegs-$count"
if [[ ! -d "$jpegs" ]]; then
  /usr/bin/python3 -c 'import numpy, PIL' 2>/dev/null || {
    echo "bench/images/make_jpegs.py needs numpy and PIL (python3-numpy, python3-pil)" >&2
    exit 77
  }
  /usr/bin/python3 "$root/bench/images/make_jpegs.py" "$jpegs.tmp" --count "$count" --seed 1
  mv "$jpegs.tmp" "$jpegs"
fi
print_machine
"$bench" --dir="$jpegs" --rounds="$rounds" | tee "$work/log"
smoke_check "$work/log" check:mismatches=0 crop:errors=0 crop:speedup\>0 transcode:kept=0
