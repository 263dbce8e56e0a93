#!/usr/bin/env bash
# Training throughput of Stoker's cpu backend against PyTorch on the same MLP (784-256-128-10,
# batch 128, synthetic uint8 data, SGD momentum), fp32 and bf16; plus the raw oneDNN matmul
# GFLOP/s of the first layer's shape, measured in the same run.
#
# Usage: bench/run_train.sh [path/to/train_bench]
#   Builds nothing: pass train_bench's path, or it is looked up in build/ and build-*/.
#   Environment:
#     SECONDS_PER_CONFIG  measuring time per configuration (default 3)
#     REPEATS             rounds; Stoker and PyTorch alternate within a round (default 3)
#     THREADS             thread counts to measure, e.g. "2 1" (default "2": the machine's cores)
#   The table shows the best and the median over the rounds. On a shared machine the best is the
#   estimate of unloaded speed; a median far below it means neighbours were busy.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench train_bench "${1:-}"
seconds="${SECONDS_PER_CONFIG:-3}"
repeats="${REPEATS:-3}"
thread_counts="${THREADS:-2}"

# No OpenBLAS threads competing with PyTorch's OpenMP ones (see docs/toolchain.md).
export OPENBLAS_NUM_THREADS=1

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "train_bench: $bench"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
print_load before
for ((i = 1; i <= repeats; i++)); do
  for threads in $thread_counts; do
    OMP_NUM_THREADS="$threads" "$bench" --seconds="$seconds" --threads="$threads" | tee -a "$log"
    OMP_NUM_THREADS="$threads" /usr/bin/python3 "$here/train_pytorch.py" --seconds "$seconds" \
      --threads "$threads" | tee -a "$log"
  done
done
print_load after
echo

PYTHONPATH="$here" /usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

from benchlib import log_rows

runs = {}
for kind, fields in log_rows(sys.argv[1]):
    if kind == "matmul":
        runs.setdefault(("matmul", fields["precision"], fields["threads"]), []).append(
            float(fields["gflops"]))
    elif kind in ("stoker", "pytorch"):
        runs.setdefault((kind, fields["precision"], fields["threads"]), []).append(
            (float(fields["samples_per_s"]), float(fields["train_gflops"])))


def best(key, index=0):
    return max(r[index] for r in runs[key])


def median(key, index=0):
    return statistics.median(r[index] for r in runs[key])


thread_counts = sorted({k[2] for k in runs}, key=int, reverse=True)
rounds = max(len(v) for v in runs.values())
targets = {"fp32": 2.0, "bf16": 3.0}
print(f"MLP 784-256-128-10, batch 128; best (median) of {rounds} rounds; "
      "GFLOP/s = 3 x forward FLOPs x samples/s (best)")
print()
print("| threads | precision | Stoker samples/s | Stoker GFLOP/s | PyTorch 1.13 samples/s "
      "| PyTorch GFLOP/s | Stoker/PyTorch | target |")
print("|---|---|---|---|---|---|---|---|")
for threads in thread_counts:
    for precision in ("fp32", "bf16"):
        s, p = ("stoker", precision, threads), ("pytorch", precision, threads)
        if s not in runs or p not in runs:
            continue
        torch_name = "bf16 autocast" if precision == "bf16" else "fp32"
        print(f"| {threads} | {precision} (PyTorch {torch_name}) | {best(s):,.0f} ({median(s):,.0f}) "
              f"| {best(s, 1):.0f} | {best(p):,.0f} ({median(p):,.0f}) | {best(p, 1):.0f} "
              f"| {best(s) / best(p):.2f}x ({median(s) / median(p):.2f}x) "
              f"| >= {targets[precision]:.0f}x |")
print()
print("| oneDNN matmul 128x784x256 | threads | GFLOP/s best (median) |")
print("|---|---|---|")
for threads in thread_counts:
    for precision in ("fp32", "bf16"):
        key = ("matmul", precision, threads)
        if key in runs:
            print(f"| {precision} | {threads} | {max(runs[key]):.0f} "
                  f"({statistics.median(runs[key]):.0f}) |")
PY
