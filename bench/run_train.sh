#!/usr/bin/env bash
# Training throughput of Stoker's cpu backend against PyTorch at its best (issue 30) on the same
# MLP (784-256-128-10, batch 128, synthetic uint8 data normalised inside the step, SGD momentum),
# fp32 and bf16, threads 1 and 2; plus the raw oneDNN matmul GFLOP/s of the first layer's shape,
# measured in the same run.
#
# PyTorch is the pinned peer of bench/peers/ (torch 2.15 from PyPI, CPU; bench/peers/install.sh),
# measured in each configuration of bench/model_peer.py (eager, torch.compile default and
# max-autotune; bf16 under torch.autocast), each in a process of its own; the row's PyTorch figure
# is its best configuration (highest median), named in the table. Compile time is reported apart
# (the first step, before the warm-up; round 1 starts from an empty inductor cache of the row's
# own, later rounds reuse it), never inside samples/s. A configuration the peer cannot run (say, no
# torch.compile) is listed as an error and left out of the best.
#
# Usage: bench/run_train.sh [path/to/train_bench]
#   Builds nothing: pass train_bench's path, or it is looked up in build/ and build-*/.
#   Environment:
#     SECONDS_PER_CONFIG  measuring time per configuration (default 3)
#     REPEATS             rounds; Stoker and PyTorch alternate within a round, the order swapping
#                         from one round to the next (default 3)
#     THREADS             thread counts to measure (default "1 2")
#     CONFIGS             PyTorch's configurations (default "eager compile-default
#                         compile-max-autotune")
#     WARMUP              untimed steps before each window (default 30)
#     PEER_PYTHON         the peer's Python (default bench/peers/venv/bin/python;
#                         /usr/bin/python3: Debian's torch 1.13, whose compiled rows are errors)
#     SMOKE=1             a second (about 10 s with the peers: torch's imports): 0.2 s per
#                         configuration, 1 round, 1 thread, PyTorch eager only and only where the
#                         peers are installed; fails (smoke_check) on a zero rate or a wrong batch
#   The tables show the best and the median over the rounds. On a shared machine the best is the
#   estimate of unloaded speed; a median far below it means neighbours were busy. A full run
#   (3 rounds, 2 thread counts) takes about 10 minutes, most of it torch.compile.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench train_bench "${1:-}"
find_peers
# Precisions are measured one at a time (Stoker, then each PyTorch configuration in a process of
# its own); smoke mode runs both in one process per side.
precision_groups="fp32 bf16"
if [[ "$smoke" == 1 ]]; then
  seconds=0.2 repeats=1 thread_counts=1 warmup=1 configs=eager precision_groups=fp32,bf16
else
  seconds="${SECONDS_PER_CONFIG:-3}"
  repeats="${REPEATS:-3}"
  thread_counts="${THREADS:-1 2}"
  warmup="${WARMUP:-30}"
  configs="${CONFIGS:-eager compile-default compile-max-autotune}"
fi

# No OpenBLAS threads competing with PyTorch's OpenMP ones (see docs/toolchain.md).
export OPENBLAS_NUM_THREADS=1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$work/log"
echo "train_bench: $bench"
echo "peer: $([[ "$peers" == 1 ]] && echo "$peer_python" || echo "not run")"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
print_load before

stoker() {  # ROUND THREADS PRECISIONS (comma-separated)
  OMP_NUM_THREADS="$2" "$bench" --seconds="$seconds" --threads="$2" --precisions="$3" |
    grep -E '^(matmul|stoker) ' | sed "s/\$/ round=$1/" | tee -a "$log"
}
# One process per configuration: a crash or an inductor error costs that row only. Each row and
# configuration has an inductor cache of this run's own: round 1 compiles from nothing, later
# rounds reuse what it left.
pytorch() {  # ROUND THREADS PRECISIONS CONFIG
  local out rc=0 precision
  out="$(OMP_NUM_THREADS="$2" TORCHINDUCTOR_CACHE_DIR="$work/inductor/$2-$3-$4" \
    "$peer_python" "$here/train_pytorch.py" --seconds "$seconds" \
    --warmup "$warmup" --threads "$2" --precisions "$3" --configs "$4" 2>"$work/peer.err")" || rc=$?
  out="$(grep '^pytorch ' <<<"$out" || true)"
  if grep -q ' error=' <<<"$out"; then tail -n 5 "$work/peer.err" >&2; fi
  for precision in ${3//,/ }; do  # a line for each precision, if only to say it failed
    if ! grep -q " precision=$precision " <<<"$out"; then
      tail -n 5 "$work/peer.err" >&2
      out+=$'\n'"pytorch network=mlp precision=$precision threads=$2 batch=128 config=$4"
      out+=" error=exited-$rc-without-a-figure"
    fi
  done
  grep . <<<"$out" | sed "s/\$/ round=$1/" | tee -a "$log"
}
for ((r = 1; r <= repeats; r++)); do
  for threads in $thread_counts; do
    for precision in $precision_groups; do
      if ((r % 2 == 1)); then stoker "$r" "$threads" "$precision"; fi
      if [[ "$peers" == 1 ]]; then
        for config in $configs; do pytorch "$r" "$threads" "$precision" "$config"; done
      fi
      if ((r % 2 == 0)); then stoker "$r" "$threads" "$precision"; fi
    done
  done
done
print_load after
echo

PYTHONPATH="$here" /usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

from benchlib import log_rows

stoker, matmul, peer, errors, compile_s, versions = {}, {}, {}, {}, {}, set()
for kind, f in log_rows(sys.argv[1]):
    if kind == "matmul":
        matmul.setdefault((f["threads"], f["precision"]), []).append(float(f["gflops"]))
    elif kind == "stoker":
        stoker.setdefault((f["threads"], f["precision"]), []).append(
            (float(f["samples_per_s"]), float(f["train_gflops"])))
    elif kind == "pytorch":
        versions.add(f.get("torch", "?"))
        key = (f["threads"], f["precision"], f["config"])
        if "error" in f:
            errors.setdefault(key, []).append(f["error"])
            continue
        peer.setdefault(key, []).append((float(f["samples_per_s"]), float(f["train_gflops"])))
        if "compile_s" in f:
            compile_s.setdefault(key, []).append((int(f["round"]), float(f["compile_s"])))

torch_name = "PyTorch " + ("/".join(sorted(versions)) if versions else "(not run)")


def best(rows, index=0):
    return max(r[index] for r in rows)


def median(rows, index=0):
    return statistics.median(r[index] for r in rows)


def ratio(a, b, suffix="x"):
    return f"{a / b:.2f}{suffix}" if b > 0 else "-"


def best_config(threads, precision):
    """PyTorch's configuration with the highest median samples/s, or None."""
    found = [(median(rows), k[2]) for k, rows in peer.items() if k[:2] == (threads, precision)]
    return max(found)[1] if found else None


keys = sorted(set(stoker) | {k[:2] for k in peer} | {k[:2] for k in errors},
              key=lambda k: (int(k[0]), k[1] != "fp32"))
rounds = max((len(v) for v in list(stoker.values()) + list(peer.values())), default=0)
print(f"MLP 784-256-128-10, batch 128; best (median) of {rounds} rounds; GFLOP/s = 3 x forward "
      f"FLOPs x samples/s (best); {torch_name}'s best configuration: highest median samples/s "
      "(bf16: under torch.autocast)")
print()
print(f"| threads | precision | Stoker samples/s | Stoker GFLOP/s | {torch_name} best configuration "
      f"| {torch_name} samples/s | PyTorch GFLOP/s | Stoker/PyTorch | goal |")
print("|---|---|---|---|---|---|---|---|---|")
for threads, precision in keys:
    s = stoker.get((threads, precision))
    config = best_config(threads, precision)
    p = peer.get((threads, precision, config))
    cells = [f"{best(s):,.0f} ({median(s):,.0f})", f"{best(s, 1):.0f}"] if s else ["-", "-"]
    cells += [config or "none ran",
              f"{best(p):,.0f} ({median(p):,.0f})" if p else "-", f"{best(p, 1):.0f}" if p else "-",
              f"{ratio(best(s), best(p))} ({ratio(median(s), median(p))})" if s and p else "-"]
    print(f"| {threads} | {precision} | {' | '.join(cells)} | >= 2x |")
print()
print(f"| threads | precision | {torch_name} configuration | samples/s best (median) | rounds "
      "| median / best configuration's | compile s, round 1 (later rounds' median) | errors |")
print("|---|---|---|---|---|---|---|---|")
known = ["eager", "eager-channels-last", "compile-default", "compile-max-autotune"]
for key in sorted(set(peer) | set(errors), key=lambda k: (
        int(k[0]), k[1] != "fp32", known.index(k[2]) if k[2] in known else len(known), k[2])):
    threads, precision, config = key
    rows, failed = peer.get(key), errors.get(key, [])
    failures = f"{len(failed)}: {failed[0]}" if failed else ""
    if not rows:
        print(f"| {threads} | {precision} | {config} | - | 0 | - | - | {failures} |")
        continue
    top = peer[(threads, precision, best_config(threads, precision))]
    times = sorted(compile_s.get(key, []))
    later = [t for _, t in times[1:]]
    compiled = (f"{times[0][1]:.1f}" + (f" ({statistics.median(later):.1f})" if later else "")
                if times else "-")
    print(f"| {threads} | {precision} | {config} | {best(rows):,.0f} ({median(rows):,.0f}) "
          f"| {len(rows)} | {ratio(median(rows), median(top), '')} | {compiled} | {failures} |")
print()
print("| oneDNN matmul 128x784x256 | threads | GFLOP/s best (median) |")
print("|---|---|---|")
for (threads, precision), values in sorted(matmul.items(), key=lambda kv: int(kv[0][0])):
    print(f"| {precision} | {threads} | {max(values):.0f} ({statistics.median(values):.0f}) |")
PY

rules=(stoker:samples_per_s\>0 stoker:batch=128 matmul:gflops\>0)
[[ "$peers" == 1 ]] && rules+=(pytorch:samples_per_s\>0 pytorch:batch=128)
smoke_check "$log" "${rules[@]}"
