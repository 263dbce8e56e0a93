#!/usr/bin/env bash
# Data-parallel training on cpu ranks (issue 16's benchmark): Stoker (bench/ddp_bench.cc: forked
# ranks, Gloo over loopback, the bucketed reducer) against PyTorch 1.13 DistributedDataParallel
# with the gloo backend (bench/ddp_pytorch.py), on the MLP of examples/fashion-mnist-mlp.yaml
# (784-256-128-10, SGD momentum 0.9), synthetic data, one core and one thread per rank.
# Measured per round, alternating Stoker and PyTorch: 1 rank at the per-rank batch b, RANKS ranks
# at b each (global batch RANKS x b), and 1 rank at RANKS x b (the same global batch in one
# process).
#
# Scaling efficiency = samples/s(RANKS ranks) / (RANKS x samples/s(1 rank)), both at the same
# per-rank batch b (the usual definition); the 1-rank run at RANKS x b is shown beside it.
# PyTorch gets its input as float32 already normalised; Stoker's model takes uint8 and normalises
# it inside its step.
#
# Usage: bench/run_ddp.sh [path/to/ddp_bench]
#   Builds nothing: pass ddp_bench's path, or it is looked up in build/ and build-*/.
#   Environment:
#     SECONDS_PER_CONFIG  timed window per configuration (default 3)
#     REPEATS             rounds (default 3)
#     BATCH               per-rank batch (default 128, the example's batch_size)
#     RANKS               ranks of the data-parallel runs (default 2: this machine's cores)
#     PRECISION           fp32 (default) or bf16 (PyTorch: autocast)
#     BUCKET_BYTES        gradient bucket size of both (default 26214400: DDP's 25 MiB; DDP
#                         still caps its first bucket at 1 MiB)
#   The table shows the best and the median over the rounds. On a shared machine the best is the
#   estimate of unloaded speed; a median far below it means neighbours were busy.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench ddp_bench "${1:-}"
seconds="${SECONDS_PER_CONFIG:-3}"
repeats="${REPEATS:-3}"
batch="${BATCH:-128}"
ranks="${RANKS:-2}"
precision="${PRECISION:-fp32}"
bucket_bytes="${BUCKET_BYTES:-26214400}"
bucket_mb="$(/usr/bin/python3 -c "print($bucket_bytes / 1048576)")"
big_batch=$((ranks * batch))

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "ddp_bench: $bench"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "blas: $(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null |
  sed -n 's/^Value: *//p')"
print_load before
# One thread per rank: OpenBLAS must not start its own (see docs/toolchain.md). (After the lines
# above: nproc counts OMP_NUM_THREADS.)
export OPENBLAS_NUM_THREADS=1
export OMP_NUM_THREADS=1
pytorch() {
  /usr/bin/python3 "$here/ddp_pytorch.py" --seconds "$seconds" --precision "$precision" \
    --bucket-cap-mb "$bucket_mb" "$@" |
    tee -a "$log"
}
stoker() {
  "$bench" --seconds="$seconds" --precision="$precision" --bucket_bytes="$bucket_bytes" "$@" |
    tee -a "$log"
}
for ((i = 1; i <= repeats; i++)); do
  pytorch --ranks 1 --batch "$batch"
  stoker --ranks=1 --batch="$batch"
  pytorch --ranks "$ranks" --batch "$batch"
  stoker --ranks="$ranks" --batch="$batch"
  pytorch --ranks 1 --batch "$big_batch"
  stoker --ranks=1 --batch="$big_batch"
done
print_load after
echo

/usr/bin/python3 - "$log" "$ranks" "$batch" <<'PY'
import json
import statistics
import sys

ranks, batch = int(sys.argv[2]), int(sys.argv[3])
runs = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        runs.setdefault((r["impl"], r["ranks"], r["batch_per_rank"]), []).append(r)


def rates(key):
    return [r["samples_per_s"] for r in runs[key]]


def best(key):
    return max(rates(key))


def median(key):
    return statistics.median(rates(key))


one, many, big = (1, batch), (ranks, batch), (1, ranks * batch)
rounds = max(len(v) for v in runs.values())
first = runs[("stoker", *one)][0]
print(f"MLP {first['model']}, {first['precision']}, per-rank batch {batch}; samples/s (global), "
      f"best (median) of {rounds} rounds; one core and one thread per rank; gradient buckets "
      f"{runs[('stoker', *many)][0]['bucket_bytes']:,} bytes")
print()
print("| configuration | global batch | Stoker samples/s | PyTorch 1.13 samples/s | Stoker/PyTorch |")
print("|---|---|---|---|---|")
for label, (n, b) in (("1 rank, plain model", one),
                      (f"{ranks} ranks, Gloo (Stoker reducer / PyTorch DDP)", many),
                      ("1 rank, plain model", big)):
    s, p = ("stoker", n, b), ("pytorch", n, b)
    print(f"| {label} | {n * b} | {best(s):,.0f} ({median(s):,.0f}) | {best(p):,.0f} "
          f"({median(p):,.0f}) | {best(s) / best(p):.2f}x ({median(s) / median(p):.2f}x) |")
print()
print(f"| scaling efficiency, {ranks} ranks | Stoker | PyTorch DDP |")
print("|---|---|---|")
for label, base in ((f"over 1 rank at batch {batch} (same per-rank batch)", one),
                    (f"over 1 rank at batch {ranks * batch} (same global batch)", big)):
    cells = []
    for impl in ("stoker", "pytorch"):
        m, o = (impl, *many), (impl, *base)
        cells.append(f"{best(m) / (ranks * best(o)):.0%} "
                     f"({median(m) / (ranks * median(o)):.0%})")
    print(f"| {label} | {' | '.join(cells)} |")
print()
reduced = runs[("stoker", *many)]
print("| Stoker reducer, per step (median over rounds) | value |")
print("|---|---|")
for field, label in (("allreduce_ms_per_step", "all-reduce ms (overlapped or not)"),
                     ("exposed_ms_per_step", "exposed ms (Finish waited)"),
                     ("step_ms", "step ms")):
    print(f"| {label} | {statistics.median(r[field] for r in reduced):.3f} |")
print(f"| all-reduce bytes | "
      f"{statistics.median(r['allreduce_bytes'] / r['steps'] for r in reduced):,.0f} |")
print(f"| all-reduce calls | "
      f"{statistics.median(r['allreduce_calls'] / r['steps'] for r in reduced):.1f} |")
print(f"| all-reduce GB/s (bytes / all-reduce seconds) | "
      f"{statistics.median(r['allreduce_gb_per_s'] for r in reduced):.2f} |")
print()
print(f"PyTorch BLAS: {', '.join(runs[('pytorch', *one)][0]['blas'])}; input float32 "
      "pre-normalised (Stoker: uint8, normalised inside its step)")
print(f"Goal (issue 16): Stoker >= 2x PyTorch DDP at {ranks} ranks, >= 85% scaling efficiency")
PY
