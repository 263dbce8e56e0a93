#!/usr/bin/env bash
# Input-pipeline benchmark, one run: Stoker's loader processes -> ring -> consumer against
# PyTorch's DataLoader on Fashion-MNIST; raw ring bandwidth against memcpy; the loader/consumer
# overlap experiment. Prints the raw lines, then tables with ratios and targets.
#
# Usage: bench/run_pipeline.sh [path/to/pipeline_bench]
#   Builds nothing: pass pipeline_bench's path, or it is looked up in build/ and build-*/ (it finds
#   stoker-loader by the path it was built with; override with PIPELINE_FLAGS=--loader=PATH).
#   EPOCHS (default 30) sets Stoker's epochs per loader count, TORCH_EPOCHS (default 2) PyTorch's.
#   The peer runs in bench/peers/install.sh's environment (PEER_PYTHON overrides it).
#   SMOKE=1: one epoch each, 16 MiB through the ring, 4 overlap batches; checks the sample counts.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench pipeline_bench "${1:-}"
export OPENBLAS_NUM_THREADS=1
find_peers
epochs="${EPOCHS:-30}" torch_epochs="${TORCH_EPOCHS:-2}" flags=()
if [[ "$smoke" == 1 ]]; then
  epochs=1 torch_epochs=1 flags=(--ring_mib=16 --repeats=1 --overlap_batches=4)
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "pipeline_bench: $bench"
print_machine
print_load before
# shellcheck disable=SC2086
"$bench" --epochs="$epochs" "${flags[@]}" ${PIPELINE_FLAGS:-} | tee -a "$log"
if [[ "$peers" == 1 ]]; then
  "$peer_python" "$here/pipeline_pytorch.py" --epochs "$torch_epochs" | tee -a "$log"
fi
print_load after
echo

# Every throughput line counts the samples after each run's first batch: 60,000 - 256 an epoch.
smoke_check "$log" throughput:samples_per_s\>0 throughput:samples=59744 ring:read_gb_per_s\>0 \
  ring:copy_gb_per_s\>0 overlap:pipelined_s\>0
PYTHONPATH="$here" /usr/bin/python3 - "$log" <<'PY'
import sys

from benchlib import log_rows

rows = log_rows(sys.argv[1])

tp = {(f["system"], f["workers"]): f for k, f in rows if k == "throughput"}
print("Fashion-MNIST, batch 256, consumer normalises to float32; samples/s after the first batch "
      "(start-up = spawn to first batch, apart)")
print()
print("| workers (K) | Stoker samples/s | Stoker start-up s | PyTorch DataLoader samples/s "
      "| PyTorch start-up s | Stoker/PyTorch | target |")
print("|---|---|---|---|---|---|---|")
for workers in ("1", "2"):
    s, p = tp.get(("stoker", workers)), tp.get(("pytorch", workers))
    if s and p:
        sr, pr = float(s["samples_per_s"]), float(p["samples_per_s"])
        print(f"| {workers} | {sr:,.0f} | {float(s['startup_s']):.2f} | {pr:,.0f} "
              f"| {float(p['startup_s']):.2f} | {sr / pr:.0f}x | >= 20x |")
print()

ring = [f for k, f in rows if k == "ring"]
if ring:
    print("1 MiB slots; a producer thread streams each MiB into a slot (as a loader does); the")
    print("consumer reads it in place (as the trainer and a DMA copy do) or copies it out (a staging")
    print("copy Stoker never makes); best of repeats; ratios against one core's cache-hot memcpy")
    print()
    print("| slots | ring GB/s, consumer reads | / memcpy | ring GB/s, consumer copies out "
          "| / memcpy | memcpy 1 MiB cache-hot GB/s | memcpy over the same working set GB/s "
          "| target |")
    print("|---|---|---|---|---|---|---|---|")
    for f in ring:
        rd, cp, hot, same = (float(f[k]) for k in ("read_gb_per_s", "copy_gb_per_s",
                                                  "memcpy_hot_gb_per_s",
                                                  "memcpy_same_ws_gb_per_s"))
        print(f"| {f['slots']} | {rd:.1f} | {100 * rd / hot:.0f}% | {cp:.1f} "
              f"| {100 * cp / hot:.0f}% | {hot:.1f} | {same:.1f} | >= 50% |")
    print()

ov = [f for k, f in rows if k == "overlap"]
if ov:
    print("| L ms | C ms | K | serial s | pipelined s | ideal s | pipelined/ideal | stall | "
          "expected stall | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for f in ov:
        ratio = float(f["ratio"])
        stall, expected = float(f["stall"]), float(f["expected_stall"])
        ok = ratio <= 1.05 and abs(stall - expected) <= 0.05
        print(f"| {f['L_ms']} | {f['C_ms']} | {f['K']} | {float(f['serial_s']):.3f} "
              f"| {float(f['pipelined_s']):.3f} | {float(f['ideal_s']):.3f} | {ratio:.3f} "
              f"| {stall:.3f} | {expected:.3f} | {'yes' if ok else 'NO'} |")
PY
