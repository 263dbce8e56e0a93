#!/usr/bin/env bash
# Stoker against an earlier Stoker: the same benchmarks (vision_bench on the example CNN and
# ResNet-20, train_bench's MLP) from two build trees, interleaved in the same minutes, so that a
# change that should not move speed (a refactoring) is shown not to. No PyTorch involved.
#
# Usage: bench/run_before_after.sh OLD_BUILD_DIR NEW_BUILD_DIR
#   Each tree needs bench/vision_bench and bench/train_bench (cmake --build DIR --target
#   vision_bench train_bench; an old commit can be built in a `git worktree`).
#   Environment:
#     REPEATS             rounds (default 3); odd rounds run old then new, even rounds new then old
#     SECONDS_PER_CONFIG  timed window per measurement (default 4), after WARMUP steps (default 3)
#     THREADS             threads of both (default 2)
#     JOBS, PRECISIONS    as bench/run_vision.sh
#     SMOKE=1             one round of the example CNN in fp32 and the MLP, 0.2 s each (the same
#                         tree may be given twice); fails on a zero rate
#   Prints every measurement, then per benchmark the median samples/s of each side and new/old.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
[[ $# -eq 2 ]] || { sed -n '6,9p' "$0" >&2; exit 2; }
old="$1" new="$2"
for tree in "$old" "$new"; do
  for program in vision_bench train_bench; do
    [[ -x "$tree/bench/$program" ]] ||
      { echo "no $tree/bench/$program (cmake --build $tree --target $program)" >&2; exit 1; }
  done
done
jobs="${JOBS:-$root/examples/fashion-mnist-cnn.yaml $root/examples/fashion-mnist-resnet.yaml}"
precisions="${PRECISIONS:-fp32 bf16}"
seconds="${SECONDS_PER_CONFIG:-4}"
warmup="${WARMUP:-3}"
repeats="${REPEATS:-3}"
threads="${THREADS:-2}"
if [[ "$smoke" == 1 ]]; then
  jobs="$root/examples/fashion-mnist-cnn.yaml" precisions=fp32 seconds=0.2 warmup=1 repeats=1
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS="$threads"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "old: $old"
echo "new: $new"
measure() {  # SIDE TREE KEY COMMAND...: every "stoker ... samples_per_s=N" line it prints
  local side=$1 tree=$2 key=$3 load line
  shift 3
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$tree/bench/$@" 2>&1 | grep '^stoker .*samples_per_s=' | while read -r line; do
    echo "$side $key load=$load $line" | tee -a "$log"
  done
}
one_round() {  # SIDE TREE
  local side=$1 tree=$2 job precision
  for job in $jobs; do
    for precision in $precisions; do
      measure "$side" "$tree" "vision:$(basename "$job" .yaml):$precision" vision_bench --job "$job" \
        --precision "$precision" --seconds "$seconds" --warmup "$warmup" --threads "$threads"
    done
  done
  measure "$side" "$tree" "train:mlp" train_bench --seconds="$seconds" --threads="$threads"
}
for ((r = 1; r <= repeats; r++)); do
  if ((r % 2 == 1)); then one_round old "$old"; one_round new "$new"
  else one_round new "$new"; one_round old "$old"; fi
done
smoke_check "$log" old:samples_per_s\>0 new:samples_per_s\>0
/usr/bin/python3 - "$log" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, key = line.split()[:2]
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    if "samples_per_s" not in fields:
        continue
    if key.startswith("train"):  # train_bench: one line per precision and path
        key = f"train:{fields.get('path', '?')}:{fields.get('precision', '?')}"
    runs.setdefault((key, side), []).append(float(fields["samples_per_s"]))
keys = sorted({k for k, _ in runs})
print(f"\n{'benchmark':40} {'old samples/s':>14} {'new samples/s':>14} {'new/old':>8}")
for key in keys:
    old, new = runs.get((key, "old"), []), runs.get((key, "new"), [])
    if not old or not new:
        continue
    o, n = statistics.median(old), statistics.median(new)
    print(f"{key:40} {o:14.1f} {n:14.1f} {n / o:8.3f}")
PY
