#!/usr/bin/env bash
# Data-parallel training on cpu ranks (issue 16's benchmark, issue 30's peers): Stoker
# (bench/ddp_bench.cc: forked ranks, Gloo over loopback, the bucketed reducer) against PyTorch
# DistributedDataParallel over gloo at its best (bench/ddp_pytorch.py: the pinned torch 2.15 of
# bench/peers/, gradient_as_bucket_view=True, the best of several bucket sizes), on the MLP of
# examples/fashion-mnist-mlp.yaml (784-256-128-10, SGD momentum 0.9), synthetic uint8 data
# normalised inside the step on both sides. Only the MLP: ddp_bench trains no other network (it
# has no --job), so ResNet-20's data-parallel row waits for it.
# Measured per round, alternating Stoker and PyTorch first:
#   1 rank x 1 thread at the per-rank batch b          (ddp_bench --ranks=1; PyTorch plain model)
#   RANKS ranks x 1 thread at b each (global RANKS x b) (Stoker's reducer; PyTorch DDP, once per
#                                                        bucket size of BUCKETS_MB)
#   1 rank x 1 thread at RANKS x b                      (the same global batch in one process)
#   1 rank x RANKS threads at RANKS x b                 (the same cores in one process: Stoker's
#                                                        train_bench --threads, the same MLP model
#                                                        and TrainStep; PyTorch's plain model)
#
# Scaling efficiency = samples/s(RANKS ranks) / (RANKS x samples/s(1 rank x 1 thread)) at the
# same per-rank batch (the usual definition); beside it the ranks against 1 rank x RANKS threads
# at the same global batch (issue 30: >= 90 % on ResNet-20).
#
# Usage: bench/run_ddp.sh [path/to/ddp_bench [path/to/train_bench]]
#   Builds nothing: pass the programs' paths, or they are looked up in build/ and build-*/
#   (train_bench first beside ddp_bench; smoke mode does not use it).
#   Environment:
#     SECONDS_PER_CONFIG  timed window per configuration (default 3)
#     REPEATS             rounds (default 3)
#     BATCH               per-rank batch (default 128, the example's batch_size)
#     RANKS               ranks of the data-parallel runs (default 2: this machine's cores)
#     PRECISION           fp32 (default) or bf16 (PyTorch: autocast)
#     BUCKET_BYTES        Stoker's gradient bucket size (default 26214400: DDP's default 25 MiB)
#     BUCKETS_MB          PyTorch DDP's bucket_cap_mb values, the best reported (default
#                         "0.25 1 5 25"; the MLP's gradients are 0.9 MiB)
#     PEER_PYTHON         the peer's Python (default bench/peers/venv/bin/python;
#                         /usr/bin/python3: Debian's torch 1.13)
#     SMOKE=1             a second (about 10 s with the peers): 0.2 s windows, 4 warm-up steps,
#                         1 round, Stoker's 1 and RANKS ranks, PyTorch only DDP at the first
#                         bucket size and only where the peers are installed; fails (smoke_check)
#                         on a zero rate or a wrong batch
#   The tables show the best and the median over the rounds. On a shared machine the best is the
#   estimate of unloaded speed; a median far below it means neighbours were busy.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench ddp_bench "${1:-}"
ddp_bench="$bench"
train_bench=""
if [[ "$smoke" != 1 ]]; then  # the 1 rank x RANKS threads row: beside ddp_bench by default
  given="${2:-}"
  [[ -z "$given" && -x "$(dirname "$ddp_bench")/train_bench" ]] &&
    given="$(dirname "$ddp_bench")/train_bench"
  find_bench train_bench "$given"
  train_bench="$bench"
  bench="$ddp_bench"
fi
find_peers
batch="${BATCH:-128}"
ranks="${RANKS:-2}"
precision="${PRECISION:-fp32}"
bucket_bytes="${BUCKET_BYTES:-26214400}"
buckets_mb="${BUCKETS_MB:-0.25 1 5 25}"
if [[ "$smoke" == 1 ]]; then
  seconds=0.2 repeats=1 warmup=4 buckets_mb="${buckets_mb%% *}"
else
  seconds="${SECONDS_PER_CONFIG:-3}"
  repeats="${REPEATS:-3}"
  warmup=40
fi
big_batch=$((ranks * batch))

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$work/log"
echo "ddp_bench: $bench"
echo "train_bench: ${train_bench:-not run}"
echo "peer: $([[ "$peers" == 1 ]] && echo "$peer_python" || echo "not run")"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
print_load before
# One thread per rank: OpenBLAS must not start its own (see docs/toolchain.md). (After the lines
# above: nproc counts OMP_NUM_THREADS.)
export OPENBLAS_NUM_THREADS=1
export OMP_NUM_THREADS=1
pytorch() {  # ROUND ARGS...: a key=value line of kind "pytorch", or one saying it failed
  local round=$1 out rc=0
  shift
  out="$("$peer_python" "$here/ddp_pytorch.py" --seconds "$seconds" --warmup-steps "$warmup" \
    --precision "$precision" "$@" 2>"$work/peer.err")" || rc=$?
  out="$(grep '^pytorch ' <<<"$out" || true)"
  if [[ -z "$out" ]]; then
    tail -n 5 "$work/peer.err" >&2
    out="pytorch args=$(tr ' ' , <<<"$*") error=exited-$rc-without-a-figure"
  fi
  echo "$out round=$round" | tee -a "$log"
}
stoker() {  # ROUND ARGS...: ddp_bench's JSON line as key=value words of kind "stoker"
  local round=$1
  shift
  "$bench" --seconds="$seconds" --warmup_steps="$warmup" --precision="$precision" \
    --bucket_bytes="$bucket_bytes" "$@" |
    /usr/bin/python3 -c '
import json, sys
lines = [json.loads(line) for line in sys.stdin if line.startswith("{")]
if not lines:
    sys.exit("ddp_bench printed no result")
for r in lines:
    r["threads"] = r.pop("omp_threads", 1)
    words = [k + "=" + str(v).replace(", ", ",").replace(" ", "-") for k, v in r.items()
             if k != "impl"]
    print(r.get("impl", "stoker"), *words, "round=" + sys.argv[1])' "$round" | tee -a "$log"
}
stoker_threads() {  # ROUND: 1 rank x RANKS threads at RANKS x b, train_bench's TrainStep
  OMP_NUM_THREADS="$ranks" "$train_bench" --seconds="$seconds" --threads="$ranks" \
    --batch="$big_batch" --precisions="$precision" | grep '^stoker ' |
    sed "s/\$/ mode=single ranks=1 batch_per_rank=$big_batch program=train_bench round=$1/" |
    tee -a "$log"
}
peer_round() {  # ROUND
  [[ "$peers" == 1 ]] || return 0
  for mb in $buckets_mb; do
    pytorch "$1" --ranks "$ranks" --batch "$batch" --bucket-cap-mb "$mb"
  done
  [[ "$smoke" == 1 ]] && return 0
  pytorch "$1" --ranks 1 --batch "$batch"
  pytorch "$1" --ranks 1 --batch "$big_batch"
  pytorch "$1" --ranks 1 --threads "$ranks" --batch "$big_batch"
}
stoker_round() {  # ROUND
  stoker "$1" --ranks=1 --batch="$batch"
  stoker "$1" --ranks="$ranks" --batch="$batch"
  [[ "$smoke" == 1 ]] && return 0
  stoker "$1" --ranks=1 --batch="$big_batch"
  stoker_threads "$1"
}
for ((r = 1; r <= repeats; r++)); do
  if ((r % 2 == 1)); then
    stoker_round "$r"
    peer_round "$r"
  else
    peer_round "$r"
    stoker_round "$r"
  fi
done
print_load after
echo

PYTHONPATH="$here" /usr/bin/python3 - "$log" "$ranks" "$batch" <<'PY'
import statistics
import sys

from benchlib import log_rows

ranks, batch = int(sys.argv[2]), int(sys.argv[3])
runs, errors, versions, stoker_ddp, info = {}, [], set(), [], {}
for kind, f in log_rows(sys.argv[1]):
    if kind == "pytorch":
        versions.add(f.get("torch", "?"))
        if "error" in f or not {"ranks", "threads", "batch_per_rank", "samples_per_s"} <= set(f):
            errors.append(f"{f.get('args', '?')}: {f.get('error', 'no figure in its line')}")
            continue
        info.setdefault("blas", f.get("blas"))
        info.setdefault("optimizer", f.get("optimizer"))
    bucket = f.get("bucket_cap_mb", "-") if kind == "pytorch" else "-"
    key = (kind, int(f["ranks"]), int(f["threads"]), int(f["batch_per_rank"]), bucket)
    runs.setdefault(key, []).append(float(f["samples_per_s"]))
    if kind == "stoker" and int(f["ranks"]) > 1:
        stoker_ddp.append(f)
    info.setdefault("model", f.get("model"))
    info.setdefault("precision", f.get("precision"))

torch_name = "PyTorch " + ("/".join(sorted(versions)) if versions else "(not run)")


def best(key):
    return max(runs[key]) if key in runs else None


def median(key):
    return statistics.median(runs[key]) if key in runs else None


def cell(key):
    return f"{best(key):,.0f} ({median(key):,.0f})" if key in runs else "-"


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


# PyTorch DDP's bucket size: the one with the highest median.
sweep = {k[4]: k for k in runs if k[0] == "pytorch" and k[1] == ranks}
tuned = max(sweep.values(), key=median)[4] if sweep else None
rows = {
    "one": (1, 1, batch), "ddp": (ranks, 1, batch), "big": (1, 1, ranks * batch),
    "threads": (1, ranks, ranks * batch),
}


def key(impl, name):
    n, t, b = rows[name]
    return (impl, n, t, b, tuned if impl == "pytorch" and n > 1 else "-")


rounds = max((len(v) for v in runs.values()), default=0)
stoker_bucket = f"{int(stoker_ddp[0]['bucket_bytes']):,} bytes" if stoker_ddp else "-"
print(f"MLP {info.get('model')}, {info.get('precision')}, per-rank batch {batch}; samples/s "
      f"(global), best (median) of {rounds} rounds; each rank pinned to its own cores. Stoker's "
      f"gradient buckets {stoker_bucket}; {torch_name} DDP over gloo with "
      f"gradient_as_bucket_view=True, bucket_cap_mb {tuned} (the best median of "
      f"{', '.join(sorted(sweep, key=float)) or 'none'})")
print()
print(f"| configuration | global batch | Stoker samples/s | {torch_name} samples/s "
      "| Stoker/PyTorch |")
print("|---|---|---|---|---|")
for name, label in (("one", "1 rank x 1 thread, plain model"),
                    ("ddp", f"{ranks} ranks x 1 thread, Gloo (Stoker reducer / PyTorch DDP)"),
                    ("big", "1 rank x 1 thread, plain model"),
                    ("threads", f"1 rank x {ranks} threads, plain model")):
    s, p = key("stoker", name), key("pytorch", name)
    n, _, b = rows[name]
    print(f"| {label} | {n * b} | {cell(s)} | {cell(p)} | {ratio(best(s), best(p))} "
          f"({ratio(median(s), median(p))}) |")
print()
print(f"| scaling efficiency, {ranks} ranks x 1 thread | Stoker | {torch_name} DDP |")
print("|---|---|---|")
for label, base, factor in (
        (f"over {ranks} x 1 rank x 1 thread at batch {batch} (same per-rank batch)", "one", ranks),
        (f"over {ranks} x 1 rank x 1 thread at batch {ranks * batch} (same global batch)", "big",
         ranks),
        (f"over 1 rank x {ranks} threads at batch {ranks * batch} (same cores, same global batch)",
         "threads", 1)):
    cells = []
    for impl in ("stoker", "pytorch"):
        m, o = key(impl, "ddp"), key(impl, base)
        if m in runs and o in runs and best(o) > 0 and median(o) > 0:
            cells.append(f"{best(m) / (factor * best(o)):.0%} "
                         f"({median(m) / (factor * median(o)):.0%})")
        else:
            cells.append("-")
    print(f"| {label} | {' | '.join(cells)} |")
print()
if sweep:
    print(f"| {torch_name} DDP, {ranks} ranks, bucket_cap_mb | samples/s best (median) | rounds |")
    print("|---|---|---|")
    for mb in sorted(sweep, key=float):
        print(f"| {mb} | {cell(sweep[mb])} | {len(runs[sweep[mb]])} |")
    print()
if stoker_ddp:
    print("| Stoker reducer, per step (median over rounds) | value |")
    print("|---|---|")
    for field, label in (("allreduce_ms_per_step", "all-reduce ms (overlapped or not)"),
                         ("exposed_ms_per_step", "exposed ms (Finish waited)"),
                         ("step_ms", "step ms")):
        print(f"| {label} | {statistics.median(float(r[field]) for r in stoker_ddp):.3f} |")
    def per_step(field):
        return statistics.median(float(r[field]) / float(r["steps"]) for r in stoker_ddp)

    print(f"| all-reduce bytes | {per_step('allreduce_bytes'):,.0f} |")
    print(f"| all-reduce calls | {per_step('allreduce_calls'):.1f} |")
    print(f"| all-reduce GB/s (bytes / all-reduce seconds) | "
          f"{statistics.median(float(r['allreduce_gb_per_s']) for r in stoker_ddp):.2f} |")
    print()
for error in errors:
    print(f"PyTorch failed: {error}")
if versions:
    print(f"PyTorch: optimizer {info.get('optimizer')}, BLAS libraries loaded: {info.get('blas')}; "
          "both sides take uint8 and normalise inside the step")
print(f"Goals (issue 30): Stoker >= 2x PyTorch DDP; {ranks} ranks x 1 thread >= 90% of 1 rank x "
      f"{ranks} threads (on ResNet-20; the MLP's is reported)")
PY

rules=(stoker:samples_per_s\>0 stoker:batch_per_rank="$batch")
[[ "$peers" == 1 ]] && rules+=(pytorch:samples_per_s\>0 pytorch:batch_per_rank="$batch")
smoke_check "$log" "${rules[@]}"
