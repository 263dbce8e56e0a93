#!/usr/bin/env bash
# Image input-pipeline benchmark, one run: Stoker's loader processes (image folder and WebDataset
# shards) -> ring -> a consumer releasing batches at once, against PyTorch's DataLoader with
# torchvision's transforms on the same JPEGs: RandomResizedCrop(224) + horizontal flip, uint8,
# batches of 256, 1 and 2 worker processes, each side RUNS times, interleaved; Stoker in both
# JPEG decode modes (dataset.image.decode: exact, torchvision's pixels; and fast). Also: the index
# build, the shards read the way the loaders read them against dd (cold and warm page cache), a
# per-stage profile of both sides in one process, and (when perf is installed) where a loader's
# CPU time goes. Prints the raw lines, then tables with best, median and ratios.
#
# Usage: bench/run_image_pipeline.sh [path/to/image_pipeline_bench]
#   Builds nothing: pass image_pipeline_bench's path, or it is looked up in build/ and build-*/
#   (it finds stoker-loader by the path it was built with, stoker-dataset beside it in
#   data/index/). Environment: WORK (default /tmp/stoker-image-bench: the JPEGs, made once with
#   bench/images/make_jpegs.py, and kept), COUNT images (2560 = 10 batches of 256), EPOCHS per run
#   (3), RUNS per side (3), PER_SHARD samples per shard (512), PERF=0 to skip the perf profile,
#   READS=0 to skip the cold and warm read comparisons (the throughput and profiles only).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
EXTRA_TARGETS=stoker-dataset find_bench image_pipeline_bench "${1:-}"
dataset_tool="$(dirname "$bench")/../data/index/stoker-dataset"
if [[ ! -x "$dataset_tool" ]]; then
  echo "stoker-dataset not found at $dataset_tool: build it (target stoker-dataset)" >&2
  exit 1
fi
work=${WORK:-/tmp/stoker-image-bench}
count=${COUNT:-2560}
epochs=${EPOCHS:-3}
runs=${RUNS:-3}
per_shard=${PER_SHARD:-512}
export OPENBLAS_NUM_THREADS=1
mkdir -p "$work"
log="$work/run.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }
run() { "$@" | tee -a "$log"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.3f", b - a}'; }  # since $1

say "image_pipeline_bench: $bench"
say "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
loadavg() { awk -v when="$1" '{print "loadavg when=" when " one=" $1 " five=" $2 " fifteen=" $3}' /proc/loadavg; }
say "$(loadavg before)"

# The JPEGs (bench/images/make_jpegs.py, as it is), made once per WORK and COUNT.
jpegs="$work/jpegs-$count"
if [[ "$(find "$jpegs" -name '*.jpg' 2>/dev/null | wc -l)" != "$count" ]]; then
  rm -rf "$jpegs"
  /usr/bin/python3 "$root/bench/images/make_jpegs.py" "$jpegs" --count "$count" --seed 1
fi
say "jpegs dir=$jpegs files=$(find "$jpegs" -name '*.jpg' | wc -l) bytes=$(find "$jpegs" -name '*.jpg' -printf '%s\n' | awk '{s += $1} END {print s}')"

# The same images packed into shards (not timed against anything; its time is shown).
rm -rf "$work/shards"
mkdir -p "$work/shards"
start=$(date +%s.%N)
pattern=$("$dataset_tool" pack --root "$jpegs" --out "$work/shards/train" \
  --samples-per-shard "$per_shard" | tail -1)
say "pack shards=$(find "$work/shards" -name '*.tar' | wc -l) pattern=$pattern seconds=$(elapsed "$start")"

folder=(--format=image_folder "--path=$jpegs" "--index_file=$work/folder.index")
shards=(--format=shards "--path=$pattern" "--index_file=$work/shards.index")
run "$bench" "${folder[@]}" --parts=index
run "$bench" "${shards[@]}" --parts=index

# Cold reads: each file's pages dropped (posix_fadvise DONTNEED, checked with mincore), and the
# whole page cache too where this user may (echo 1 > /proc/sys/vm/drop_caches).
if (sync && echo 1 >/proc/sys/vm/drop_caches) 2>/dev/null; then drop=permitted; else drop=refused; fi
say "drop_caches $drop"
cold() {  # FORMAT-ARGS...
  [[ "$drop" == permitted ]] && sync && echo 1 >/proc/sys/vm/drop_caches
  run "$bench" "$@" --parts=evict
}
dd_shards() {  # CACHE
  local start bytes f seconds
  bytes=$(stat -c %s "$work"/shards/*.tar | awk '{s += $1} END {print s}')
  # After drop_caches dd itself must be read from disk: not in the time.
  dd if=/dev/null of=/dev/null status=none
  [[ "$1" == cold ]] && run "$bench" "${shards[@]}" --parts=evict
  start=$(date +%s.%N)
  for f in "$work"/shards/*.tar; do dd if="$f" of=/dev/null bs=1M status=none; done
  seconds=$(elapsed "$start")
  say "read format=shards how=dd cache=$1 bytes=$bytes seconds=$seconds mb_per_s=$(awk -v b="$bytes" -v s="$seconds" 'BEGIN {printf "%.1f", b / 1e6 / s}')"
}
# Each read line says how much of the files was in the page cache before (resident_before).
for _ in $(seq "$([[ "${READS:-1}" != 0 ]] && echo "$runs" || echo 0)"); do
  cold "${shards[@]}"
  run "$bench" "${shards[@]}" --parts=read
  run "$bench" "${shards[@]}" --parts=read
  cold "${shards[@]}"
  dd_shards cold
  dd_shards warm
  cold "${folder[@]}"
  run "$bench" "${folder[@]}" --parts=read
  run "$bench" "${folder[@]}" --parts=read
done

# Where the time goes, one process each, warm cache.
run "$bench" "${folder[@]}" --parts=profile --profile_images=1024 --decode=exact
run "$bench" "${folder[@]}" --parts=profile --profile_images=1024 --decode=fast
run "$bench" "${shards[@]}" --parts=profile --profile_images=1024
run /usr/bin/python3 "$here/image_pipeline_pytorch.py" --root "$jpegs" --profile 1024

# Throughput, the sides interleaved so that the neighbours' load falls on all of them.
for _ in $(seq "$runs"); do
  for decode in exact fast; do
    run "$bench" "${folder[@]}" --parts=throughput --epochs="$epochs" --decode="$decode"
    run "$bench" "${shards[@]}" --parts=throughput --epochs="$epochs" --decode="$decode"
  done
  run /usr/bin/python3 "$here/image_pipeline_pytorch.py" --root "$jpegs" --epochs "$epochs"
done
say "$(loadavg after)"

# One loader (K = 1, one epoch) under perf, in each decode mode: its CPU time by library and by
# function. Debian's libjpeg.so.62 is stripped of its static functions, so the Huffman decoder
# (jdhuff.c: decode_mcu_fast and friends) shows as addresses: those from jpeg_make_d_derived_tbl
# to the first exported function after jinit_huff_decoder are jdhuff.c, summed as "Huffman".
if [[ "${PERF:-1}" != 0 ]] && command -v perf >/dev/null; then
  for decode in exact fast; do
    perf record -q -F 999 -o "$work/perf-$decode.data" -- "$bench" "${folder[@]}" \
      --parts=throughput --loaders=1 --epochs=1 --decode="$decode" >/dev/null 2>&1 || true
    [[ -s "$work/perf-$decode.data" ]] || continue
    echo "perf ($decode): the loader's share of all samples by library, then its top functions"
    { perf report -i "$work/perf-$decode.data" --sort comm,dso --stdio 2>/dev/null |
      grep ' stoker-loader ' | head -8; } || true
    { perf report -i "$work/perf-$decode.data" --sort comm,dso,sym --stdio 2>/dev/null |
      grep ' stoker-loader ' | head -12; } || true
    lib=$(ldd "$(dirname "$bench")/../worker/stoker-loader" | awk '/libjpeg/ {print $3}')
    if [[ -n "$lib" ]]; then
      read -r lo hi < <(nm -D "$lib" | awk '$2 == "T" {print $1, $3}' | sort | awk '
        $2 ~ /^jpeg_make_d_derived_tbl/ {lo = $1} $2 ~ /^jinit_huff_decoder/ {after = 1; next}
        after && !hi {hi = $1} END {print lo, hi}')
      perf report -i "$work/perf-$decode.data" --sort comm,dso,sym --stdio 2>/dev/null |
        awk -v lo="$lo" -v hi="$hi" -v d="$decode" '$2 == "stoker-loader" && $3 ~ /libjpeg/ {
          a = $5; p = $1; sub("%", "", p)
          if (a ~ /^(jpeg_make_d_derived_tbl|jpeg_fill_bit_buffer|jpeg_huff_decode)$/) { s += p; next }
          if (a !~ /^0x/) next
          a = substr(a, 3); while (length(a) < 16) a = "0" a
          if (a >= lo && a < hi) s += p }
          END { printf "perf (%s): libjpeg Huffman decoding (jdhuff.c) %.1f%% of all samples\n", d, s }' |
        tee -a "$log"
    fi
  done
fi
echo

PYTHONPATH="$here" /usr/bin/python3 - "$log" <<'PY'
import statistics
import sys

from benchlib import log_rows

rows = log_rows(sys.argv[1])


def num(f, key):
    return float(f[key])


tp = {}
for kind, f in rows:
    if kind == "throughput":
        decode = f.get("decode", "exact") if f["system"] == "stoker" else "-"
        tp.setdefault((f["system"], f["format"], f["workers"], decode), []).append(f)


def stats(key, field):
    values = [num(f, field) for f in tp.get(key, [])]
    return (max(values), statistics.median(values), len(values)) if values else None


for kind, f in rows:
    if kind == "index":
        print(f"index ({f['format']}): {f['samples']} images in {f['sources']} files, "
              f"built in {num(f, 'build_s'):.3f} s, written in {num(f, 'write_s'):.3f} s, "
              f"{int(f['index_bytes']) / 1024:.0f} KiB")
print()
print("Images/s from the first batch to the last (best / median of runs); per worker = / K; "
      "per CPU-s = images per CPU-second of the worker processes over the same window")
print()
print("| K | decode | Stoker folder img/s | per worker | per CPU-s | PyTorch img/s | per worker "
      "| per CPU-s | Stoker/PyTorch | per CPU-s ratio (median) | goal per worker >= 300 "
      "| goal ratio >= 3x (per CPU-s) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for k in ("1", "2"):
    for decode in ("exact", "fast"):
        s, p = stats(("stoker", "image_folder", k, decode), "images_per_s"), \
            stats(("pytorch", "image_folder", k, "-"), "images_per_s")
        sc, pc = stats(("stoker", "image_folder", k, decode), "images_per_cpu_s"), \
            stats(("pytorch", "image_folder", k, "-"), "images_per_cpu_s")
        if not (s and p):
            continue
        kk = int(k)
        print(f"| {k} | {decode} | {s[0]:.0f} / {s[1]:.0f} | {s[0] / kk:.0f} / {s[1] / kk:.0f} "
              f"| {sc[0]:.0f} / {sc[1]:.0f} | {p[0]:.0f} / {p[1]:.0f} "
              f"| {p[0] / kk:.0f} / {p[1] / kk:.0f} | {pc[0]:.0f} / {pc[1]:.0f} "
              f"| {s[0] / p[0]:.2f}x / {s[1] / p[1]:.2f}x | {sc[1] / pc[1]:.2f}x "
              f"| {'met' if s[1] / kk >= 300 else 'NOT met'} "
              f"| {'met' if sc[1] / pc[1] >= 3 else 'NOT met'} |")
print()
print("| K | decode | Stoker shards img/s | Stoker folder img/s | shards / folder (median) "
      "| shards per CPU-s | folder per CPU-s | shards per CPU-s / PyTorch's |")
print("|---|---|---|---|---|---|---|---|")
for k in ("1", "2"):
    for decode in ("exact", "fast"):
        sh, fo = stats(("stoker", "shards", k, decode), "images_per_s"), \
            stats(("stoker", "image_folder", k, decode), "images_per_s")
        shc, foc = stats(("stoker", "shards", k, decode), "images_per_cpu_s"), \
            stats(("stoker", "image_folder", k, decode), "images_per_cpu_s")
        pc = stats(("pytorch", "image_folder", k, "-"), "images_per_cpu_s")
        if sh and fo:
            ratio = f"{shc[1] / pc[1]:.2f}x" if pc else "-"
            print(f"| {k} | {decode} | {sh[0]:.0f} / {sh[1]:.0f} | {fo[0]:.0f} / {fo[1]:.0f} "
                  f"| {sh[1] / fo[1]:.2f} | {shc[1]:.0f} | {foc[1]:.0f} | {ratio} |")
print()
starts = {}
for key, fs in tp.items():
    starts[key] = statistics.median(num(f, "startup_s") for f in fs)
print("start-up (spawn to first batch, median s): " +
      ", ".join(f"{s} {fmt} {d} K={k}: {v:.2f}" for (s, fmt, k, d), v in sorted(starts.items())))
print()

reads = {}
for kind, f in rows:
    if kind == "read":
        cache = f.get("cache") or ("cold" if num(f, "resident_before") < 0.05 else "warm")
        reads.setdefault((f["format"], f["how"], cache), []).append(f)
print("Reads of one epoch's bytes (MB/s, best / median); loader = EpochSampleOrder, fadvise "
      "WILLNEED per batch, pread per sample; dd = each shard whole, bs=1M")
print()
print("| what | cold | warm |")
print("|---|---|---|")
for fmt, how in (("shards", "loader"), ("shards", "dd"), ("image_folder", "loader")):
    cells = []
    for cache in ("cold", "warm"):
        v = [num(f, "mb_per_s") for f in reads.get((fmt, how, cache), [])]
        cells.append(f"{max(v):.0f} / {statistics.median(v):.0f}" if v else "-")
    print(f"| {fmt}, {how} | {cells[0]} | {cells[1]} |")
print()

for kind, f in rows:
    if kind == "profile" and f.get("system") == "pytorch":
        print(f"PyTorch, one process, us per image: read {f['read_us']}, decode (full) "
              f"{f['decode_us']}, RandomResizedCrop {f['resize_us']}, flip {f['flip_us']}, "
              f"PILToTensor {f['to_tensor_us']}; total {f['total_us']} "
              f"({1e6 / num(f, 'total_us'):.0f} images per CPU-s)")
    elif kind == "profile":
        print(f"Stoker {f['format']} ({f.get('decode', 'exact')}), one process, us per image: read {f['read_us']}, decode of "
              f"the crop box {f['decode_box_us']} (box = {100 * num(f, 'box_fraction'):.0f}% of the "
              f"pixels; DCT-scaled: {int(f['denom2']) + int(f['denom4']) + int(f['denom8'])} of "
              f"{f['images']}), resize + flip + CHW {f['resize_us']}; transform "
              f"{f['transform_us']}; a full-size decode would be {f['full_decode_us']}, of which "
              f"entropy decoding {f['entropy_us']} (the crop decode entropy-decodes the rows down "
              f"to the box's bottom: {100 * num(f, 'rows_needed_fraction'):.0f}% of them on "
              f"average, ~{num(f, 'entropy_us') * num(f, 'rows_needed_fraction'):.0f} us)")
    elif kind == "profile_make":
        print(f"Stoker {f['format']} ({f.get('decode', 'exact')}), ImageBatchSource::Make in one process (a loader without "
              f"the ring): {num(f, 'images_per_s'):.0f} images/s, "
              f"{num(f, 'images_per_cpu_s'):.0f} per CPU-s")
PY
