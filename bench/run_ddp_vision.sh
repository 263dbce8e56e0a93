#!/usr/bin/env bash
# Data-parallel training of a vision network (issue 30's ResNet-20 row): Stoker (ddp_bench --job:
# forked ranks, Gloo over loopback, the bucketed reducer) against PyTorch DDP (ddp_pytorch.py
# --network: gloo, gradient_as_bucket_view, channels_last) on the job file's network, synthetic
# 28x28 uint8 batches normalised in the step. Per round, the sides alternating:
#   2 ranks x 1 thread at the per-rank batch b (global 2b), Stoker over Gloo and over shared
#   memory (what its trainer uses when every rank is on one machine);
#   1 rank x 2 threads at 2b (the same global batch in one process: the baseline the goal uses);
#   1 rank x 1 thread at b.
# Efficiency = samples/s(2 ranks x 1 thread) / samples/s(1 rank x 2 threads) (goal: >= 90 % for
# ResNet-20), and Stoker / PyTorch DDP at 2 ranks (goal: >= 2x).
#
# Usage: bench/run_ddp_vision.sh [BUILD_DIR]   (default build/; needs bench/ddp_bench and
#   bench/vision_bench). Environment: JOB (default examples/fashion-mnist-resnet.yaml),
#   PRECISION (fp32), BATCH per rank (64), REPEATS (3), SECONDS_PER_CONFIG (4),
#   BUCKET_MB (PyTorch's bucket_cap_mb, default 25: ResNet-20's 1 MiB of gradients in one bucket).
#   SMOKE=1: the example CNN, batch 16, 0.3 s, one round; fails on a zero rate.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
build="${1:-${STOKER_BUILD:-$root/build}}"
for program in ddp_bench vision_bench; do
  [[ -x "$build/bench/$program" ]] ||
    { echo "no $build/bench/$program (cmake --build $build --target $program)" >&2; exit 1; }
done
job="${JOB:-$root/examples/fashion-mnist-resnet.yaml}"
precision="${PRECISION:-fp32}" batch="${BATCH:-64}" repeats="${REPEATS:-3}"
seconds="${SECONDS_PER_CONFIG:-4}" bucket_mb="${BUCKET_MB:-25}" warmup=10
if [[ "$smoke" == 1 ]]; then
  job="$root/examples/fashion-mnist-cnn.yaml" batch=16 repeats=1 seconds=0.3 warmup=4
fi
find_peers
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$work/log"
net="$work/$(basename "$job" .yaml).json"
"$build/bench/vision_bench" --job "$job" --write_network "$net"
print_machine
print_load before
export OPENBLAS_NUM_THREADS=1
stoker() {  # RANKS THREADS BATCH [TRANSPORT: gloo (default) or shm]
  OMP_NUM_THREADS="$2" "$build/bench/ddp_bench" --job "$job" --ranks "$1" --threads_per_rank "$2" \
    --batch "$3" --precision "$precision" --seconds "$seconds" --warmup_steps "$warmup" \
    --transport "${4:-gloo}" |
    /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("stoker ranks=%d threads=%s batch=%d transport=%s samples_per_s=%.1f step_ms=%.3f" % (
        r["ranks"], sys.argv[1], r["batch_per_rank"], sys.argv[2], r["samples_per_s"],
        r["step_ms"]))' "$2" "${4:-gloo}" |
    tee -a "$log"
}
pytorch() {  # RANKS THREADS BATCH [ignored]
  [[ "$peers" == 1 && "${4:-gloo}" == gloo ]] || return 0
  OMP_NUM_THREADS="$2" "$peer_python" "$here/ddp_pytorch.py" --network "$net" --ranks "$1" \
    --threads "$2" --batch "$3" --precision "$precision" --seconds "$seconds" \
    --warmup-steps "$warmup" --bucket-cap-mb "$bucket_mb" | tee -a "$log"
}
for ((r = 1; r <= repeats; r++)); do
  for config in "2 1 $batch gloo" "2 1 $batch shm" "1 2 $((2 * batch))" "1 1 $batch"; do
    # shellcheck disable=SC2086
    if ((r % 2 == 1)); then stoker $config; pytorch $config; else pytorch $config; stoker $config; fi
  done
done
print_load after
smoke_check "$log" stoker:samples_per_s\>0 stoker:batch\>0
/usr/bin/python3 - "$log" "$(basename "$job" .yaml)" "$precision" "$batch" <<'PY'
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    words = line.split()
    f = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if words[0] in ("stoker", "pytorch") and "samples_per_s" in f:
        side = words[0] + ("/shm" if f.get("transport") == "shm" else "")
        runs.setdefault((side, f["ranks"], f["threads"]), []).append(float(f["samples_per_s"]))
network, precision, batch = sys.argv[2:5]
print(f"\n{network}, {precision}, per-rank batch {batch}; samples/s (global), median of rounds")
print()
print("| configuration | Stoker | PyTorch DDP | Stoker / PyTorch |")
print("|---|---|---|---|")
med = {k: statistics.median(v) for k, v in runs.items()}
for label, side, ranks, threads in (("2 ranks x 1 thread (Gloo)", "stoker", "2", "1"),
                                    ("2 ranks x 1 thread (shared memory)", "stoker/shm", "2", "1"),
                                    ("1 rank x 2 threads", "stoker", "1", "2"),
                                    ("1 rank x 1 thread", "stoker", "1", "1")):
    s, p = med.get((side, ranks, threads)), med.get(("pytorch", ranks, threads))
    if s is None:
        continue
    print(f"| {label} | {s:,.0f} | " + (f"{p:,.0f} | {s / p:.2f}x |" if p else "- | - |"))
for side in ("stoker", "stoker/shm", "pytorch"):
    base = "stoker" if side.startswith("stoker") else side
    two, one = med.get((side, "2", "1")), med.get((base, "1", "2"))
    if two and one:
        print(f"\n{side}: 2 ranks x 1 thread / 1 rank x 2 threads = {two / one:.0%} (goal >= 90 %)")
PY
