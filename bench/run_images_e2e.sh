#!/usr/bin/env bash
# Image datasets end to end, against IDX: Fashion-MNIST exported as a PNG image folder and packed
# into tar shards (stoker-dataset), then the example MLP and CNN (examples/fashion-mnist-*.yaml)
# trained on each of the three (idx, image_folder, shards) through a real server and worker. Prints
# each job's test accuracy and mean input stall, and the accuracy differences to IDX (the issue's
# bar: within 0.3 points, input stall < 5 %).
#
# Usage: bench/run_images_e2e.sh [MODELS]   MODELS: "mlp cnn" (default) or one of them.
#   SEEDS="1 2 3 4" (default "1") trains each job once per train.seed and reports the mean per
#   format too: the three formats hold the same pixels but an image folder lists them class by
#   class and the shards in pack order, so one seed's epochs see other batches than IDX's, and
#   single runs differ by that alone.
#   Builds nothing (scripts/setup.sh builds). Work files go to $WORK (default /tmp/stoker-images-e2e).
#   SMOKE=1: the MLP only, one epoch on the first 512 training and test images of each format;
#   fails unless the three jobs succeed with a non-zero accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
source bench/lib.sh
models=${1:-"mlp cnn"}
work=${WORK:-/tmp/stoker-images-e2e}
poll=5 limit=0
if [[ "$smoke" == 1 ]]; then
  models=mlp poll=0.3 limit=512 SEEDS=1
  work=${WORK:-/tmp/stoker-images-e2e-smoke-$$}
  trap 'rm -rf "$work"' EXIT
fi
bin=${BUILD:-${STOKER_BUILD:-build}}  # a copy of the build keeps a run safe from rebuilds
fmnist=/usr/share/datasets/fashion-mnist
rm -rf "$work"
mkdir -p "$work/data"
cp -r "$fmnist" "$work/data/fashion-mnist"  # symlinks may not leave the data root

print_machine
print_load before
start=$(date +%s)
if [[ "$limit" == 0 ]]; then
  "$bin/data/index/stoker-dataset" export-fashion-mnist --out "$work/data/fmnist-png" --format png
else
  for split in train:train t10k:test; do
    "$bin/data/index/stoker-dataset" export-idx --images "$fmnist/${split%:*}-images-idx3-ubyte.gz" \
      --labels "$fmnist/${split%:*}-labels-idx1-ubyte.gz" --out "$work/data/fmnist-png/${split#*:}" \
      --limit "$limit"
  done
fi
"$bin/data/index/stoker-dataset" pack --root "$work/data/fmnist-png/train" \
  --out "$work/data/fmnist-shards/train" --samples-per-shard 10000 | tail -1 >"$work/train-pattern"
"$bin/data/index/stoker-dataset" pack --root "$work/data/fmnist-png/test" \
  --out "$work/data/fmnist-shards/test" --samples-per-shard 10000 | tail -1 >"$work/test-pattern"
echo "export and pack: $(($(date +%s) - start)) s"
train_pattern=$(sed "s|$work/data/||" "$work/train-pattern")
test_pattern=$(sed "s|$work/data/||" "$work/test-pattern")

"$bin/server/stoker-server" --listen 127.0.0.1:0 --port-file "$work/port" --state-dir "$work/server" \
  --data-root "$work/data" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
server="127.0.0.1:$(cat "$work/port")"
"$bin/worker/stoker-worker" --server "$server" --work-dir "$work/worker" --data-root "$work/data" \
  >"$work/worker.log" 2>&1 &
worker_pid=$!
trap 'kill $worker_pid 2>/dev/null; wait $worker_pid 2>/dev/null; kill $server_pid 2>/dev/null
  [[ "$smoke" == 1 ]] && rm -rf "$work"' EXIT

# The example's job file with its dataset section replaced.
job_file() {  # MODEL FORMAT
  local src="examples/fashion-mnist-$1.yaml" out="$work/$1-$2.yaml"
  case "$2" in
    idx) cp "$src" "$out" ;;
    image_folder | shards)
      local train test
      if [ "$2" = image_folder ]; then
        train=fmnist-png/train test=fmnist-png/test
      else
        train=$train_pattern test=$test_pattern
      fi
      /usr/bin/python3 - "$src" "$out" "$2" "$train" "$test" <<'PY'
import re, sys
src, out, fmt, train, test = sys.argv[1:]
text = open(src).read()
section = (f"dataset:\n  format: {fmt}\n  train_images: \"{train}\"\n  test_images: \"{test}\"\n"
           "  classes: 10\n")
text = re.sub(r"dataset:\n(  .*\n)+", section, text)
text = re.sub(r"^name: (.*)$", r"name: \1-" + fmt.replace("_", "-"), text, flags=re.M)
open(out, "w").write(text)
PY
      ;;
  esac
  if [[ "$limit" != 0 ]]; then
    sed -i "s/^\(  epochs: \).*/\11/" "$out"
    sed -i "s/^dataset:$/dataset:\n  train_limit: $limit\n  test_limit: $limit/" "$out"
  fi
  echo "$out"
}

results=()
for model in $models; do
  for seed in ${SEEDS:-1}; do
  for format in idx image_folder shards; do
    file=$(job_file "$model" "$format")
    sed -i "s/^\(  seed: \).*/\1$seed/" "$file"
    t0=$(date +%s)
    id=$("$bin/client/stoker" --server "$server" submit "$file" | grep -oE 'j-[A-Za-z0-9_-]+' | head -1)
    [ -n "$id" ] || { echo "submit of $file failed"; exit 1; }
    while :; do
      state=$("$bin/client/stoker" --server "$server" -o json status "$id" |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
      case "$state" in *SUCCEEDED* | *FAILED* | *CANCELLED*) break ;; esac
      sleep "$poll"
    done
    json=$("$bin/client/stoker" --server "$server" -o json status "$id")
    acc=$(echo "$json" | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j.get("progress",{}).get("test_accuracy","nan"))')
    stall=$("$bin/client/stoker" --server "$server" logs "$id" |
      sed -n 's/.*input stall \([0-9]*\)%.*/\1/p' | awk '{s+=$1; n++} END {if (n) printf "%.1f", s/n; else print "nan"}')
    secs=$(($(date +%s) - t0))
    echo "RESULT model=$model format=$format seed=$seed state=$state accuracy=$acc stall_pct=$stall seconds=$secs job=$id" |
      tee -a "$work/results.log"
    results+=("$model $format $acc $stall $secs $seed")
  done
  done
done
print_load after
# In smoke mode: every job succeeded with a non-zero accuracy.
smoke_check "$work/results.log" RESULT:state=JOB_STATE_SUCCEEDED RESULT:accuracy\>0
printf '%s\n' "${results[@]}" | /usr/bin/python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
idx = {(r[0], r[5]): float(r[2]) for r in rows if r[1] == "idx"}
print("| model | format | seed | test accuracy | vs idx (points) | mean input stall | wall s |")
print("|---|---|---|---|---|---|---|")
for m, f, a, s, t, seed in rows:
    d = (float(a) - idx[(m, seed)]) * 100 if (m, seed) in idx else float("nan")
    print(f"| {m} | {f} | {seed} | {float(a):.4f} | {d:+.2f} | {s} % | {t} |")
means = {}
for m, f, a, s, t, seed in rows:
    means.setdefault((m, f), []).append((float(a), float(s), float(t)))
print()
print("| model | format | seeds | mean accuracy | vs idx mean (points) | mean stall | mean wall s |")
print("|---|---|---|---|---|---|---|")
for (m, f), v in means.items():
    acc = statistics.mean(x[0] for x in v)
    ref = statistics.mean(x[0] for x in means[(m, "idx")]) if (m, "idx") in means else float("nan")
    print(f"| {m} | {f} | {len(v)} | {acc:.4f} | {(acc - ref) * 100:+.2f} | "
          f"{statistics.mean(x[1] for x in v):.1f} % | {statistics.mean(x[2] for x in v):.0f} |")
'
