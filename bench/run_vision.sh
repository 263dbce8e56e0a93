#!/usr/bin/env bash
# Vision training speed (issue 15's benchmark, issue 30's peers): Stoker's cpu backend
# (bench/vision_bench.cc) against PyTorch at its best (bench/vision_pytorch.py) on the networks of
# job files (default: the example CNN and the ResNet-20 example), fp32 and bf16, threads 1 and 2,
# synthetic uint8 28x28 samples at the job's batch size, both sides on the same cores with the
# same thread count.
# Both sides train exactly the network the job file says: vision_bench expands it with Stoker's
# spec/ code and writes it as the checkpoint architecture JSON, which vision_pytorch.py rebuilds
# with scripts/pytorch_eval.py's torch.nn modules (optimizer, weight decay groups and label
# smoothing from the job too).
#
# PyTorch is the pinned peer of bench/peers/ (torch 2.15 from PyPI, CPU; bench/peers/install.sh),
# measured in each configuration of bench/model_peer.py (eager NCHW, eager channels_last,
# torch.compile default and max-autotune; bf16 under torch.autocast), each in a process of its
# own; the row's PyTorch figure is its best configuration (highest median), named in the table.
# Compile time is reported apart (the first step, before the warm-up; round 1 starts from an
# empty inductor cache, later rounds reuse it), never inside samples/s. A configuration the peer
# cannot run (say, no torch.compile) is listed as an error and left out of the best.
#
# Usage: bench/run_vision.sh [path/to/vision_bench]
#   Builds nothing: pass vision_bench's path, or it is looked up in build/ and build-*/.
#   Environment:
#     JOBS                job files (default "examples/fashion-mnist-cnn.yaml
#                         examples/fashion-mnist-resnet.yaml")
#     PRECISIONS          default "fp32 bf16"
#     THREADS             thread counts of both sides (default "1 2")
#     CONFIGS             PyTorch's configurations (default "eager eager-channels-last
#                         compile-default compile-max-autotune")
#     SECONDS_PER_CONFIG  timed window per measurement, after WARMUP untimed steps (default 4)
#     WARMUP              default 3
#     REPEATS             rounds (default 5); within a round each network, thread count and
#                         precision runs Stoker then PyTorch's configurations, the next round
#                         PyTorch first
#     PEER_PYTHON         the peer's Python (default bench/peers/venv/bin/python;
#                         /usr/bin/python3: Debian's torch 1.13, whose compiled rows are errors)
#     SMOKE=1             about a second (15 s with the peers: torch's imports): batch 16, 0.2 s
#                         per measurement, 1 warm-up step, 1 round, 1 thread, PyTorch eager only
#                         and only where the peers are installed; fails (smoke_check) on a zero
#                         rate or a wrong batch
#   Each measurement records the load average (1 min) when it started. The table gives the median
#   samples/s of each side, the ratio of the medians and the median of the per-round ratios
#   (paired in time, so a busy minute slows both sides of one round). A full run (5 rounds, 2
#   networks, 2 precisions, 2 thread counts) takes about 40 minutes, a third of it round 1's
#   torch.compile.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_bench vision_bench "${1:-}"
find_peers
jobs="${JOBS:-$root/examples/fashion-mnist-cnn.yaml $root/examples/fashion-mnist-resnet.yaml}"
precisions="${PRECISIONS:-fp32 bf16}"
batch_flag=()
if [[ "$smoke" == 1 ]]; then
  seconds=0.2 warmup=1 repeats=1 thread_counts=1 configs=eager batch_flag=(--batch 16)
  # One peer process per network for both precisions (each process imports torch: seconds).
  peer_groups="$(tr ' ' ',' <<<"$precisions")"
else
  seconds="${SECONDS_PER_CONFIG:-4}"
  warmup="${WARMUP:-3}"
  repeats="${REPEATS:-5}"
  thread_counts="${THREADS:-1 2}"
  configs="${CONFIGS:-eager eager-channels-last compile-default compile-max-autotune}"
  peer_groups="$precisions"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$work/log"
echo "vision_bench: $bench"
echo "peer: $([[ "$peers" == 1 ]] && echo "$peer_python" || echo "not run")"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, threads $thread_counts"
print_load before
# No OpenBLAS threads competing with the OpenMP ones (docs/toolchain.md); both sides keep their
# default OpenMP wait policy.
export OPENBLAS_NUM_THREADS=1
names=()
i=0
for job in $jobs; do
  i=$((i + 1))
  "$bench" --job "$job" --write_network "$work/net$i.json"
  field() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
  names+=("$(field "$work/net$i.json" name)")
  echo "network $i: $job: $(field "$work/net$i.json" description)"
done
load() { cut -d' ' -f1 /proc/loadavg; }
stoker() {  # ROUND JOB THREADS PRECISIONS (comma-separated)
  local precision line
  for precision in ${4//,/ }; do
    line="$(OMP_NUM_THREADS="$3" "$bench" --job "$2" --precision "$precision" \
      --seconds "$seconds" --warmup "$warmup" --threads "$3" "${batch_flag[@]}" | grep '^stoker ')"
    echo "$line round=$1 load=$(load)" | tee -a "$log"
  done
}
# One process per configuration: a crash or an inductor error costs that row only. Each row and
# configuration has an inductor cache of this run's own: round 1 compiles from nothing, later
# rounds reuse what it left.
pytorch() {  # ROUND NETWORK_INDEX THREADS PRECISIONS CONFIG
  local out rc=0 precision start
  start="$(load)"
  out="$(OMP_NUM_THREADS="$3" TORCHINDUCTOR_CACHE_DIR="$work/inductor/$2-$3-$4-$5" \
    "$peer_python" "$here/vision_pytorch.py" \
    --network "$work/net$2.json" --precision "$4" --seconds "$seconds" --warmup "$warmup" \
    --threads "$3" --configs "$5" "${batch_flag[@]}" 2>"$work/peer.err")" || rc=$?
  out="$(grep '^pytorch ' <<<"$out" || true)"
  if grep -q ' error=' <<<"$out"; then tail -n 5 "$work/peer.err" >&2; fi
  for precision in ${4//,/ }; do  # a line for each precision, if only to say it failed
    if ! grep -q " precision=$precision " <<<"$out"; then
      tail -n 5 "$work/peer.err" >&2
      out+=$'\n'"pytorch network=${names[$2 - 1]} precision=$precision threads=$3 config=$5"
      out+=" error=exited-$rc-without-a-figure"
    fi
  done
  grep . <<<"$out" | sed "s/\$/ round=$1 load=$start/" | tee -a "$log"
}
for ((r = 1; r <= repeats; r++)); do
  i=0
  for job in $jobs; do
    i=$((i + 1))
    for threads in $thread_counts; do
      for group in $peer_groups; do
        if ((r % 2 == 1)); then stoker "$r" "$job" "$threads" "$group"; fi
        if [[ "$peers" == 1 ]]; then
          for config in $configs; do pytorch "$r" "$i" "$threads" "$group" "$config"; done
        fi
        if ((r % 2 == 0)); then stoker "$r" "$job" "$threads" "$group"; fi
      done
    done
  done
done
print_load after
echo

PYTHONPATH="$here" /usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

from benchlib import log_rows

stoker, peer, errors, compile_s, loads, versions = {}, {}, {}, {}, {}, set()
for kind, f in log_rows(sys.argv[1]):
    row = (f["network"], f["precision"], f["threads"])
    loads.setdefault(row, []).append(float(f["load"]))
    if kind == "stoker":
        stoker.setdefault(row, {})[f["round"]] = float(f["samples_per_s"])
    elif kind == "pytorch":
        versions.add(f.get("torch", "?"))
        key = row + (f["config"],)
        if "error" in f:
            errors.setdefault(key, []).append(f["error"])
            continue
        peer.setdefault(key, {})[f["round"]] = float(f["samples_per_s"])
        if "compile_s" in f:
            compile_s.setdefault(key, []).append((int(f["round"]), float(f["compile_s"])))

torch_name = "PyTorch " + ("/".join(sorted(versions)) if versions else "(not run)")


def ratio(a, b, suffix="x"):
    return f"{a / b:.2f}{suffix}" if b > 0 else "-"


def best_config(row):
    """PyTorch's configuration with the highest median samples/s on `row`, or None."""
    found = [(statistics.median(v.values()), k[3]) for k, v in peer.items() if k[:3] == row]
    return max(found)[1] if found else None


KNOWN = ["eager", "eager-channels-last", "compile-default", "compile-max-autotune"]


def order(key):
    """network, threads, fp32 first, then the configurations in KNOWN's order."""
    return (key[0], int(key[2]), key[1] != "fp32") + tuple(
        (KNOWN.index(c) if c in KNOWN else len(KNOWN), c) for c in key[3:])


print(f"{torch_name}'s best configuration: the highest median samples/s (bf16: under "
      "torch.autocast); goal (issue 30): Stoker ahead by >= 1.25x")
print()
print(f"| network | precision | threads | Stoker samples/s (median) | {torch_name} best "
      "configuration | its samples/s (median) | ratio of medians | median of per-round ratios "
      "| rounds | load (1 min) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for row in sorted(set(stoker) | {k[:3] for k in peer} | {k[:3] for k in errors}, key=order):
    s, config = stoker.get(row, {}), best_config(row)
    t = peer.get(row + (config,), {})
    rounds = sorted(set(s) & set(t))
    cells = [f"{statistics.median(s.values()):,.0f}" if s else "-", config or "none ran",
             f"{statistics.median(t.values()):,.0f}" if t else "-"]
    if rounds:
        sm = statistics.median(s[r] for r in rounds)
        tm = statistics.median(t[r] for r in rounds)
        paired = [s[r] / t[r] for r in rounds if t[r] > 0]
        cells += [ratio(sm, tm), f"{statistics.median(paired):.2f}x" if paired else "-"]
    else:
        cells += ["-", "-"]
    load = loads[row]
    print(f"| {' | '.join(row)} | {' | '.join(cells)} | {len(rounds)} "
          f"| {min(load):.1f}-{max(load):.1f} |")
print()
print(f"| network | precision | threads | {torch_name} configuration | samples/s (median) | rounds "
      "| median / best configuration's | compile s, round 1 (later rounds' median) | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for key in sorted(set(peer) | set(errors), key=order):
    rates, failed = peer.get(key, {}), errors.get(key, [])
    failures = f"{len(failed)}: {failed[0]}" if failed else ""
    if not rates:
        print(f"| {' | '.join(key)} | - | 0 | - | - | {failures} |")
        continue
    top = statistics.median(peer[key[:3] + (best_config(key[:3]),)].values())
    times = sorted(compile_s.get(key, []))
    later = [t for _, t in times[1:]]
    compiled = (f"{times[0][1]:.1f}" + (f" ({statistics.median(later):.1f})" if later else "")
                if times else "-")
    median = statistics.median(rates.values())
    print(f"| {' | '.join(key)} | {median:,.0f} | {len(rates)} | {ratio(median, top, '')} "
          f"| {compiled} | {failures} |")
PY

batch="${batch_flag[1]:-128}"
rules=(stoker:samples_per_s\>0 stoker:batch="$batch")
[[ "$peers" == 1 ]] && rules+=(pytorch:samples_per_s\>0 pytorch:batch="$batch")
smoke_check "$log" "${rules[@]}"
