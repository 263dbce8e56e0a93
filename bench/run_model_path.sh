#!/usr/bin/env bash
# The MLP through the cpu backend's MLP fast path (CreateMlp) against the same MLP through the
# general network (CreateNetwork(NetworkFromMlp)), fp32 and bf16, alternating within each round so
# that both see the same machine load. Decides whether the MLP fast path earns its code (issue 13:
# delete it if the network path is within 10 %).
#
# Stoker against itself: no peer, so neither bench/peers/ nor PyTorch is needed.
#
# Usage: bench/run_model_path.sh [path/to/train_bench]
#   Builds nothing: pass train_bench's path, or it is looked up in build/ and build-*/.
#   Environment: SECONDS_PER_CONFIG (default 2), ROUNDS (default 5), HIDDEN (default 256,128),
#   BATCH (default 128), THREADS (default 2).
#   SMOKE=1: a second or two (0.2 s per configuration, 1 round, 1 thread); fails (smoke_check) on
#   a zero rate, a wrong batch or a missing path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench train_bench "${1:-}"
batch="${BATCH:-128}"
if [[ "$smoke" == 1 ]]; then
  seconds=0.2 rounds=1 threads=1
else
  seconds="${SECONDS_PER_CONFIG:-2}" rounds="${ROUNDS:-5}" threads="${THREADS:-2}"
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "train_bench: $bench"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
print_load before
OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive "$bench" --seconds="$seconds" \
  --threads="$threads" --paths=mlp,network --rounds="$rounds" --hidden="${HIDDEN:-256,128}" \
  --batch="$batch" | grep -E "^(config|stoker)" | tee "$log"
print_load after
/usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    kind, *pairs = line.split()
    if kind != "stoker":
        continue
    f = dict(p.split("=", 1) for p in pairs if "=" in p)
    runs.setdefault((f["precision"], f["path"]), []).append(float(f["step_us"]))
print()
print("| precision | MLP path step us (best / median) | network path step us (best / median) "
      "| network / MLP (best) | (median) |")
print("|---|---|---|---|---|")
missing = []
for precision in sorted({p for p, _ in runs}):
    mlp, net = runs.get((precision, "mlp")), runs.get((precision, "network"))
    if not mlp or not net:
        missing.append(f"{precision}: {'mlp' if not mlp else 'network'}")
        continue
    ratio = (f"| {min(net) / min(mlp):.2f} | {statistics.median(net) / statistics.median(mlp):.2f} |"
             if min(mlp) > 0 else "| - | - |")
    print(f"| {precision} | {min(mlp):.0f} / {statistics.median(mlp):.0f} "
          f"| {min(net):.0f} / {statistics.median(net):.0f} {ratio}")
if missing:
    sys.exit(f"train_bench measured no {', '.join(missing)} path")
PY

smoke_check "$log" stoker:samples_per_s\>0 stoker:batch="$batch"
