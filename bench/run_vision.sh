#!/usr/bin/env bash
# Vision training speed (issue 15's benchmark): Stoker's cpu backend (bench/vision_bench.cc)
# against PyTorch 1.13 (bench/vision_pytorch.py) on the networks of job files (default: the
# example CNN and the ResNet-20 example), fp32 and bf16, synthetic uint8 28x28 samples at the
# job's batch size, both sides on the same cores with the same thread count.
# Both sides train exactly the network the job file says: vision_bench expands it with Stoker's
# spec/ code and writes it as the checkpoint architecture JSON, which vision_pytorch.py rebuilds
# with scripts/pytorch_eval.py's torch.nn modules (optimizer, weight decay groups and label
# smoothing from the job too).
#
# Usage: bench/run_vision.sh [path/to/vision_bench]
#   Builds nothing: pass vision_bench's path, or it is looked up in build/ and build-*/.
#   Environment:
#     JOBS                job files (default "examples/fashion-mnist-cnn.yaml
#                         examples/fashion-mnist-resnet.yaml")
#     PRECISIONS          default "fp32 bf16"
#     SECONDS_PER_CONFIG  timed window per measurement, after WARMUP untimed steps (default 4)
#     WARMUP              default 3
#     REPEATS             rounds (default 5); within a round each configuration runs Stoker then
#                         PyTorch, the next round PyTorch then Stoker
#     THREADS             threads of both sides (default 2: this machine's cores)
#   Each measurement records the load average (1 min) when it started. The table gives the median
#   samples/s of each side, the ratio of the medians and the median of the per-round ratios
#   (paired in time, so a busy minute slows both sides of one round).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench vision_bench "${1:-}"
jobs="${JOBS:-$root/examples/fashion-mnist-cnn.yaml $root/examples/fashion-mnist-resnet.yaml}"
precisions="${PRECISIONS:-fp32 bf16}"
seconds="${SECONDS_PER_CONFIG:-4}"
warmup="${WARMUP:-3}"
repeats="${REPEATS:-5}"
threads="${THREADS:-2}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$work/log"
echo "vision_bench: $bench"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, threads $threads"
echo "torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__, "mkldnn", torch.backends.mkldnn.is_available())')"
print_load before
# No OpenBLAS threads competing with the OpenMP ones (docs/toolchain.md); both sides keep their
# default OpenMP wait policy.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS="$threads"
i=0
for job in $jobs; do
  i=$((i + 1))
  "$bench" --job "$job" --write_network "$work/net$i.json"
  echo "network $i: $job: $(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['description'])" "$work/net$i.json")"
done
load() { cut -d' ' -f1 /proc/loadavg; }
stoker() {
  echo "round=$1 load=$(load) $("$bench" --job "$2" --precision "$3" --seconds "$seconds" \
    --warmup "$warmup" --threads "$threads")" | tee -a "$log"
}
pytorch() {
  echo "round=$1 load=$(load) $(/usr/bin/python3 "$here/vision_pytorch.py" --network "$2" \
    --precision "$3" --seconds "$seconds" --warmup "$warmup" --threads "$threads")" | tee -a "$log"
}
for ((r = 1; r <= repeats; r++)); do
  i=0
  for job in $jobs; do
    i=$((i + 1))
    for precision in $precisions; do
      if ((r % 2 == 1)); then
        stoker "$r" "$job" "$precision"
        pytorch "$r" "$work/net$i.json" "$precision"
      else
        pytorch "$r" "$work/net$i.json" "$precision"
        stoker "$r" "$job" "$precision"
      fi
    done
  done
done
print_load after
echo

/usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    fields = dict(p.split("=", 1) for p in line.split() if "=" in p)
    side = line.split()[2]
    key = (fields["network"], fields["precision"])
    runs.setdefault(key, {}).setdefault(side, {})[fields["round"]] = (
        float(fields["samples_per_s"]), float(fields["load"]))

print("| network | precision | Stoker samples/s (median) | PyTorch 1.13 samples/s (median) "
      "| ratio of medians | median of per-round ratios | rounds | load (1 min) |")
print("|---|---|---|---|---|---|---|---|")
for (network, precision), sides in runs.items():
    stoker, torch = sides.get("stoker", {}), sides.get("pytorch", {})
    rounds = sorted(set(stoker) & set(torch))
    if not rounds:
        continue
    s = statistics.median(stoker[r][0] for r in rounds)
    t = statistics.median(torch[r][0] for r in rounds)
    paired = statistics.median(stoker[r][0] / torch[r][0] for r in rounds)
    loads = [v[1] for side in (stoker, torch) for v in side.values()]
    print(f"| {network} | {precision} | {s:,.0f} | {t:,.0f} | {s / t:.2f}x | {paired:.2f}x "
          f"| {len(rounds)} | {min(loads):.1f}-{max(loads):.1f} |")
PY
