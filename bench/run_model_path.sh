#!/usr/bin/env bash
# The MLP through the cpu backend's MLP fast path (CreateMlp) against the same MLP through the
# general network (CreateNetwork(NetworkFromMlp)), fp32 and bf16, alternating within each round so
# that both see the same machine load. Decides whether the MLP fast path earns its code (issue 13:
# delete it if the network path is within 10 %).
#
# Usage: bench/run_model_path.sh [path/to/train_bench]
#   Environment: SECONDS_PER_CONFIG (default 2), ROUNDS (default 5), HIDDEN (default 256,128),
#   BATCH (default 128).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
bench="${1:-$root/build/bench/train_bench}"
[[ -x "$bench" ]] || { echo "train_bench not found at $bench: build it or pass its path" >&2; exit 1; }
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
print_load before
OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive "$bench" --seconds="${SECONDS_PER_CONFIG:-2}" \
  --threads=2 --paths=mlp,network --rounds="${ROUNDS:-5}" --hidden="${HIDDEN:-256,128}" \
  --batch="${BATCH:-128}" | grep -E "^(config|stoker)" | tee "$log"
print_load after
/usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    kind, *pairs = line.split()
    if kind != "stoker":
        continue
    f = dict(p.split("=", 1) for p in pairs)
    runs.setdefault((f["precision"], f["path"]), []).append(float(f["step_us"]))
print()
print("| precision | MLP path step us (best / median) | network path step us (best / median) "
      "| network / MLP (best) | (median) |")
print("|---|---|---|---|---|")
for precision in sorted({p for p, _ in runs}):
    mlp, net = runs[(precision, "mlp")], runs[(precision, "network")]
    print(f"| {precision} | {min(mlp):.0f} / {statistics.median(mlp):.0f} "
          f"| {min(net):.0f} / {statistics.median(net):.0f} "
          f"| {min(net) / min(mlp):.2f} | {statistics.median(net) / statistics.median(mlp):.2f} |")
PY
