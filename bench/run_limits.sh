#!/usr/bin/env bash
# The limits the comparing benchmarks' figures are put beside (issue 30), and Stoker's own
# framework overhead:
#   - peak_bench: peak GFLOP/s of AVX-512 FMA (fp32), AVX512_BF16 dot products and AMX bf16
#     tiles, and memcpy GB/s, at 1 and 2 threads;
#   - vision_bench --kernel_runs: for the example CNN and ResNet-20 in fp32 and bf16, every kernel
#     of a training step timed alone (each oneDNN primitive, Stoker's own pool, dropout, loss and
#     optimizer kernels: warm, the median of 20 runs, as benchdnn times a primitive) against the
#     median step time; overhead = step / sum of the kernels - 1 (the goal: <= 15 %).
# No peer involved. Prints the raw lines, then the tables.
#
# Usage: bench/run_limits.sh [BUILD_DIR]   (default build/; needs bench/peak_bench and
#   bench/vision_bench). Environment: THREADS (default "1 2"), REPEATS rounds of the overhead
#   measurement (default 3), SECONDS_PER_CONFIG (default 3), KERNEL_RUNS (default 20),
#   JOBS (default the example CNN and ResNet-20), PRECISIONS (default "fp32 bf16").
#   SMOKE=1: 0.1 s peaks, the CNN in fp32 at 2 threads, 3 kernel runs; fails on a zero figure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
build="${1:-${STOKER_BUILD:-$root/build}}"
for program in peak_bench vision_bench; do
  [[ -x "$build/bench/$program" ]] ||
    { echo "no $build/bench/$program (cmake --build $build --target $program)" >&2; exit 1; }
done
thread_counts="${THREADS:-1 2}"
repeats="${REPEATS:-3}"
seconds="${SECONDS_PER_CONFIG:-3}"
kernel_runs="${KERNEL_RUNS:-20}"
jobs="${JOBS:-$root/examples/fashion-mnist-cnn.yaml $root/examples/fashion-mnist-resnet.yaml}"
precisions="${PRECISIONS:-fp32 bf16}"
peak_seconds=0.5 memcpy_mib=1024
if [[ "$smoke" == 1 ]]; then
  thread_counts=2 repeats=1 seconds=0.2 kernel_runs=3 precisions=fp32 peak_seconds=0.1
  memcpy_mib=64 jobs="$root/examples/fashion-mnist-cnn.yaml"
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
print_machine
print_load before
export OPENBLAS_NUM_THREADS=1
for threads in $thread_counts; do
  OMP_NUM_THREADS="$threads" "$build/bench/peak_bench" --threads "$threads" \
    --seconds "$peak_seconds" --memcpy_mib "$memcpy_mib" | tee -a "$log"
done
for ((r = 1; r <= repeats; r++)); do
  for threads in $thread_counts; do
    for job in $jobs; do
      for precision in $precisions; do
        OMP_NUM_THREADS="$threads" "$build/bench/vision_bench" --job "$job" \
          --precision "$precision" --threads "$threads" --seconds "$seconds" \
          --kernel_runs "$kernel_runs" | grep -E '^(stoker|kernels) ' | sed "s/^/round=$r /" |
          tee -a "$log"
      done
    done
  done
done
print_load after
smoke_check "$log" peak:threads\>0 memcpy:gb_per_s\>0 kernels:kernel_sum_ms\>0 \
  kernels:step_median_ms\>0 stoker:samples_per_s\>0
echo
/usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

peaks, memcpy, kernels = {}, {}, {}
for line in open(sys.argv[1]):
    words = line.split()
    bare = [w for w in words if "=" not in w]
    f = dict(w.split("=", 1) for w in words if "=" in w)
    if not bare:
        continue
    if bare[0] == "peak" and f.get("available") == "1":
        peaks[(f["kind"], f["threads"])] = float(f["gflops"])
    elif bare[0] == "memcpy":
        memcpy[f["threads"]] = float(f["gb_per_s"])
    elif bare[0] == "kernels":
        kernels.setdefault((f["network"], f["precision"], f["threads"]), []).append(
            (float(f["kernel_sum_ms"]), float(f["step_median_ms"])))
threads = sorted({t for _, t in peaks} | set(memcpy), key=int)
print("| limit | " + " | ".join(f"{t} thread{'s' if t != '1' else ''}" for t in threads) + " |")
print("|---|" + "---|" * len(threads))
for kind, label in (("fp32_fma", "fp32 FMA GFLOP/s (AVX-512)"),
                    ("bf16_avx512", "bf16 dot GFLOP/s (AVX512_BF16)"),
                    ("bf16_amx", "bf16 GFLOP/s (AMX tiles)")):
    cells = [f"{peaks[(kind, t)]:,.0f}" if (kind, t) in peaks else "n/a" for t in threads]
    print(f"| {label} | " + " | ".join(cells) + " |")
print("| memcpy GB/s (large buffers) | " +
      " | ".join(f"{memcpy[t]:.1f}" if t in memcpy else "n/a" for t in threads) + " |")
print()
print("| network | precision | threads | sum of kernels alone, ms (median of rounds) "
      "| step, ms (median) | overhead | goal |")
print("|---|---|---|---|---|---|---|")
for (network, precision, t), rows in kernels.items():
    k = statistics.median(r[0] for r in rows)
    s = statistics.median(r[1] for r in rows)
    print(f"| {network} | {precision} | {t} | {k:.2f} | {s:.2f} | {s / k - 1:+.0%} | <= 15 % |")
PY
