#!/usr/bin/env bash
# Image input-pipeline benchmark (issue 30): JPEG -> RandomResizedCrop 224 + horizontal flip,
# uint8 [3, 224, 224], batches of 256, the same original JPEG files for every side, measured per
# CPU-second of all the side's processes and in wall-clock images/s. The sides, interleaved in
# every round (the order swapped from one round to the next):
#   Stoker       image_pipeline_bench --parts=throughput: K real stoker-loader processes (image
#                folder and WebDataset shards of the same files) -> ring -> a consumer releasing
#                each batch at once; both JPEG decodes (dataset.image.decode exact: torchvision's
#                pixels; and fast); K = 1 and 2. Its per-CPU-second counts the loaders and the
#                consumer process over the window (both printed by the bench; for an older bench
#                bench/images/consumer_cpu.py adds the consumer's CPU time over its whole run).
#   torchvision  0.29 with PyTorch 2.15's DataLoader (bench/image_pipeline_pytorch.py): the PIL
#                path (ImageFolder + v2 RandomResizedCrop + RandomHorizontalFlip + PILToTensor)
#                and torchvision.io.decode_jpeg + v2 transforms on tensors; 1 and 2 workers.
#   DALI         2.4 on its CPU backend (bench/images/dali_pipeline.py): fn.decoders.
#                image_random_crop (decodes only the crop box) + fn.resize + flip to CHW, either
#                by crop_mirror_normalize (cmn) or fn.flip + fn.transpose (flip); 1 and 2 threads.
#   SPDL         0.8 (bench/images/spdl_pipeline.py): spdl.pipeline with 1 and 2 threads,
#                spdl.io demux + decode with an FFmpeg crop/scale/hflip filter graph.
#   FFCV         1.0.2 in JPEG mode (bench/images/ffcv_pipeline.py): a .beton holding the
#                original JPEG bytes (written once, its time shown), the Loader with 1 and 2
#                threads, RandomResizedCropRGBImageDecoder + RandomHorizontalFlip.
# Every side reads every file once before timing (warm page cache) and prints one `throughput`
# line per run: images/s from the first batch to the last (the images after the first batch;
# start-up apart) and images per CPU-second over the same window. The tables show best / median
# of the rounds; a peer's row is its best configuration at that K (highest median per
# CPU-second), named. Goals (issue 30), per CPU-second: Stoker >= 1.5x DALI CPU and >= 2x the
# best torchvision configuration. Only Stoker exact and torchvision's pil path give torchvision's
# pixels; DALI, SPDL and FFCV resize with their own filters (said beside their rows).
# Also: the index build, the shards read the way the loaders read them against dd (cold and warm
# page cache), a per-stage profile of Stoker and of torchvision's PIL path in one process, and
# (when perf is installed) where a loader's CPU time goes.
#
# Usage: bench/run_image_pipeline.sh [path/to/image_pipeline_bench]
#   Builds nothing: pass image_pipeline_bench's path, or it is looked up in build/ and build-*/
#   (it finds stoker-loader by the path it was built with, stoker-dataset beside it in
#   data/index/). The peers run in bench/peers/install.sh's environment (PEER_PYTHON overrides
#   it; /usr/bin/python3 measures Debian's torchvision 0.14, the other peers then say
#   "unavailable"); a peer that is not installed is listed as such. Environment:
#     WORK       where the JPEGs (bench/images/make_jpegs.py, made once and kept), the shards, the
#                FFCV file and the log go (default /tmp/stoker-image-bench)
#     COUNT      images (2560 = 10 batches of 256; a multiple of BATCH), BATCH (256)
#     EPOCHS     per run (3); RUNS rounds (3); PER_SHARD samples per shard (512)
#     SIDES      which sides run (default "stoker torchvision dali spdl ffcv")
#     READS=0    skips the cold and warm read comparisons; PROFILE=0 the one-process profiles;
#     PERF=0     the perf profile
#     SMOKE=1    a few seconds (plus the peers' start-up where they are installed: FFCV's numba
#                compilation is ~5 s): 64 images, batches of 16, one epoch, one round, K = 1, no
#                reads, profiles or perf, the peers' cheapest configuration each; fails
#                (smoke_check) when a side fails, reports a zero rate or a wrong image count.
#   A full run (3 rounds of all sides, reads, profiles, perf) takes roughly 20-30 minutes on 2 cores.
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
sides="${SIDES:-stoker torchvision dali spdl ffcv}"
if [[ "$smoke" == 1 ]]; then
  count=64 batch=16 epochs=1 runs=1 per_shard=32 reads=0 profile=0 perf=0 loaders="1"
  tv_configs=decode_jpeg dali_configs=cmn peer_workers=1
  work="${WORK:-/tmp/stoker-image-smoke-$$}"
  [[ -n "${WORK:-}" ]] || trap 'rm -rf "$work"' EXIT
else
  count=${COUNT:-2560} batch=${BATCH:-256} epochs=${EPOCHS:-3} runs=${RUNS:-3}
  per_shard=${PER_SHARD:-512} reads=${READS:-1} profile=${PROFILE:-1} perf=${PERF:-1}
  loaders="1 2" tv_configs=pil,decode_jpeg dali_configs=cmn,flip peer_workers=1,2
  work=${WORK:-/tmp/stoker-image-bench}
fi
if ((count % batch)); then
  echo "COUNT ($count) must be a multiple of BATCH ($batch): DALI's batches are always full" >&2
  exit 1
fi
export OPENBLAS_NUM_THREADS=1
mkdir -p "$work"
log="$work/run.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }
run() { "$@" | tee -a "$log"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.3f", b - a}'; }  # since $1
side() { [[ " $sides " == *" $1 "* ]]; }

say "image_pipeline_bench: $bench"
say "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
find_peers >"$work/peers.txt"
say "$(cat "$work/peers.txt")"
say "peer python: $([[ "$peers" == 1 ]] && echo "$peer_python" || echo "not run")"
loadavg() { awk -v when="$1" '{print "loadavg when=" when " one=" $1 " five=" $2 " fifteen=" $3}' /proc/loadavg; }
say "$(loadavg before)"

# The JPEGs (bench/images/make_jpegs.py, as it is), made once per WORK and COUNT; FFCV's copy of
# them is made from these on its first run and goes with them.
jpegs="$work/jpegs-$count"
beton="$work/ffcv-$count.beton"
if [[ "$(find "$jpegs" -name '*.jpg' 2>/dev/null | wc -l)" != "$count" ]]; then
  rm -rf "$jpegs" "$beton"
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
if [[ "$reads" != 0 ]]; then
  if (sync && echo 1 >/proc/sys/vm/drop_caches) 2>/dev/null; then drop=permitted; else drop=refused; fi
  say "drop_caches $drop"
fi
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
for _ in $(seq "$([[ "$reads" != 0 ]] && echo "$runs" || echo 0)"); do
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
if [[ "$profile" != 0 ]]; then
  run "$bench" "${folder[@]}" --parts=profile --profile_images=1024 --decode=exact
  run "$bench" "${folder[@]}" --parts=profile --profile_images=1024 --decode=fast
  run "$bench" "${shards[@]}" --parts=profile --profile_images=1024
  if [[ "$peers" == 1 ]] && side torchvision; then
    run "$peer_python" "$here/image_pipeline_pytorch.py" --root "$jpegs" --profile 1024
  fi
fi

# Throughput, the sides interleaved so that the neighbours' load falls on all of them.
common=(--root "$jpegs" --epochs "$epochs" --batch "$batch" --workers "$peer_workers")
stoker_side() {
  local k decode format format_args
  side stoker || return 0
  for k in $loaders; do
    for decode in exact fast; do
      for format in folder shards; do
        format_args=("${folder[@]}")
        [[ "$format" == shards ]] && format_args=("${shards[@]}")
        run /usr/bin/python3 "$here/images/consumer_cpu.py" "$bench" "${format_args[@]}" \
          --parts=throughput --loaders="$k" --epochs="$epochs" --batch="$batch" --decode="$decode"
      done
    done
  done
}
peer_sides() {
  [[ "$peers" == 1 ]] || return 0
  if side torchvision; then
    run "$peer_python" "$here/image_pipeline_pytorch.py" "${common[@]}" --configs "$tv_configs"
  fi
  if side dali; then
    run "$peer_python" "$here/images/dali_pipeline.py" "${common[@]}" --configs "$dali_configs"
  fi
  if side spdl; then
    run "$peer_python" "$here/images/spdl_pipeline.py" "${common[@]}"
  fi
  if side ffcv; then
    run "$peer_python" "$here/images/ffcv_pipeline.py" "${common[@]}" --beton "$beton"
  fi
}
for round in $(seq "$runs"); do
  if ((round % 2)); then stoker_side; peer_sides; else peer_sides; stoker_side; fi
done
say "$(loadavg after)"

# One loader (K = 1, one epoch) under perf, in each decode mode: its CPU time by library and by
# function. Debian's libjpeg.so.62 is stripped of its static functions, so the Huffman decoder
# (jdhuff.c: decode_mcu_fast and friends) shows as addresses: those from jpeg_make_d_derived_tbl
# to the first exported function after jinit_huff_decoder are jdhuff.c, summed as "Huffman".
if [[ "$perf" != 0 ]] && command -v perf >/dev/null; then
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

PYTHONPATH="$here" /usr/bin/python3 - "$log" "$peers" "$sides" <<'PY'
import statistics
import sys

from benchlib import log_rows

rows = log_rows(sys.argv[1])
peers_ran = sys.argv[2] == "1"
sides = sys.argv[3].split()


def num(f, key):
    return float(f[key])


def all_cpu(f):
    """CPU seconds of all the side's processes over the window: the peers print that as cpu_s;
    Stoker's cpu_s is its loaders', consumer_cpu_s its own process's over the window (an
    older bench that does not print it gets it from consumer_cpu.py, over its whole life)."""
    return num(f, "cpu_s") + float(f.get("consumer_cpu_s", 0))


def per_cpu(f):
    cpu = all_cpu(f)
    return num(f, "images") / cpu if cpu > 0 else 0.0


tp = {}  # (system, config, format, K) -> lines
for kind, f in rows:
    if kind == "throughput":
        config = f.get("decode", "exact") if f["system"] == "stoker" else f["config"]
        tp.setdefault((f["system"], config, f["format"], f["workers"]), []).append(f)
missing = {f["system"]: f["reason"].replace("_", " ") for kind, f in rows if kind == "unavailable"}


def stat(key, value):
    """(best, median, runs) of value(line) over the runs of key, or None."""
    values = [value(f) for f in tp.get(key, [])]
    return (max(values), statistics.median(values), len(values)) if values else None


def rate(f):
    return num(f, "images_per_s")


def fmt(s, digits=0):
    return f"{s[0]:,.{digits}f} / {s[1]:,.{digits}f}" if s else "-"


for kind, f in rows:
    if kind == "index":
        print(f"index ({f['format']}): {f['samples']} images in {f['sources']} files, "
              f"built in {num(f, 'build_s'):.3f} s, written in {num(f, 'write_s'):.3f} s, "
              f"{int(f['index_bytes']) / 1024:.0f} KiB")
    elif kind == "pack" and f.get("system") == "ffcv":
        print(f"FFCV .beton: {f['samples']} images (the original JPEG bytes), "
              f"{int(f['bytes']) / 2**20:.0f} MiB, written in {num(f, 'seconds'):.1f} s")
print()

print("Every side and configuration: images/s from the first batch to the last, and images per "
      "CPU-second of all the side's processes over the same window (best / median of runs; "
      "CPU split = median seconds of the main process or Stoker's consumer + of the workers or "
      "loaders; Stoker's consumer figure is its whole run's)")
print()
print("| side | configuration | K | runs | img/s | per CPU-s (all processes) | CPU split (s) "
      "| start-up (s, median) |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(tp):
    system, config, form, k = key
    fs = tp[key]
    if system == "stoker":
        split = (statistics.median(float(f.get("consumer_cpu_s", 0)) for f in fs),
                 statistics.median(num(f, "cpu_s") for f in fs))
    else:
        split = (statistics.median(num(f, "main_cpu_s") for f in fs),
                 statistics.median(num(f, "worker_cpu_s") for f in fs))
    name = f"{config}" + (f" ({form})" if system == "stoker" else "")
    print(f"| {system} | {name} | {k} | {len(fs)} | {fmt(stat(key, rate))} "
          f"| {fmt(stat(key, per_cpu))} | {split[0]:.2f} + {split[1]:.2f} "
          f"| {statistics.median(num(f, 'startup_s') for f in fs):.2f} |")
print()

NOTES = {
    "stoker exact": "torchvision's pixels (PIL's bilinear on the crop box; only the box decoded)",
    "stoker fast": "fast JPEG decode: not torchvision's pixels (mean |diff| ~4 of 255)",
    "torchvision pil": "torchvision's pixels (full decode, PIL resize)",
    "torchvision decode_jpeg": "full decode; antialiased tensor resize (close to PIL's, not equal)",
    "dali": "**its resize differs in pixels** (DALI's own resampling and crop sampler); decodes "
            "only the crop box",
    "spdl": "differs in pixels (FFmpeg's JPEG decoder, swscale bilinear); full decode",
    "ffcv": "differs in pixels (full decode, OpenCV resize); reads its .beton of the same JPEG "
            "bytes",
}


def best_config(system, k):
    """The configuration of `system` with the highest median per CPU-second at K = k."""
    best = None
    for key in tp:
        if key[0] == system and key[3] == k and key[2] == "image_folder":
            s = stat(key, per_cpu)
            if best is None or s[1] > best[1][1]:
                best = (key, s)
    return best


print("Against today's peers (image folder; medians of the rounds, best in brackets; a peer's "
      "row is its best configuration at that K by median per CPU-second)")
print()
print("| K | side (configuration) | per CPU-s | img/s | Stoker exact / it (per CPU-s) "
      "| Stoker fast / it | pixels |")
print("|---|---|---|---|---|---|---|")
goals = []
for k in ("1", "2"):
    exact = stat(("stoker", "exact", "image_folder", k), per_cpu)
    fast = stat(("stoker", "fast", "image_folder", k), per_cpu)
    if not (exact or fast or any(key[3] == k for key in tp)):
        continue
    peer_best = {}
    for system in ("stoker", "torchvision", "dali", "spdl", "ffcv"):
        if system not in sides:
            continue
        configs = ("exact", "fast") if system == "stoker" else (None,)
        for config in configs:
            if system == "stoker":
                key = ("stoker", config, "image_folder", k)
                s = stat(key, per_cpu)
                label, note = f"Stoker ({config})", NOTES[f"stoker {config}"]
            else:
                found = best_config(system, k)
                key, s = found if found else (None, None)
                label = f"{system} ({key[1]})" if key else system
                note = NOTES.get(f"{system} {key[1]}" if key else "", NOTES.get(system, ""))
                peer_best[system] = (key, s)
            if s is None:
                why = (f"did not install: {missing[system]}" if system in missing else
                       "not run" if system != "stoker" and not peers_ran else "no result")
                print(f"| {k} | {label} | {why} | | | | |")
                continue
            w = stat(key, rate)
            r_exact = f"{exact[1] / s[1]:.2f}x" if exact and system != "stoker" and s[1] else ""
            r_fast = f"{fast[1] / s[1]:.2f}x" if fast and system != "stoker" and s[1] else ""
            print(f"| {k} | {label} | {s[1]:,.0f} ({s[0]:,.0f}) | {w[1]:,.0f} ({w[0]:,.0f}) "
                  f"| {r_exact} | {r_fast} | {note} |")
    for system, want in (("dali", 1.5), ("torchvision", 2.0)):
        key, s = peer_best.get(system, (None, None))
        if not s or not s[1]:
            continue
        for name, mine in (("exact", exact), ("fast", fast)):
            if mine:
                ratio = mine[1] / s[1]
                verdict = "met" if ratio >= want else "NOT met"
                goals.append(f"K={k}: Stoker {name} / {system} ({key[1]}) = {ratio:.2f}x per "
                             f"CPU-second (goal >= {want}x): {verdict}")
print()
for line in goals:
    print(line)
if goals:
    print()

print("| K | decode | Stoker shards img/s | Stoker folder img/s | shards / folder (median) "
      "| shards per CPU-s | folder per CPU-s |")
print("|---|---|---|---|---|---|---|")
for k in ("1", "2"):
    for decode in ("exact", "fast"):
        sh = stat(("stoker", decode, "shards", k), rate)
        fo = stat(("stoker", decode, "image_folder", k), rate)
        shc = stat(("stoker", decode, "shards", k), per_cpu)
        foc = stat(("stoker", decode, "image_folder", k), per_cpu)
        if sh and fo:
            print(f"| {k} | {decode} | {fmt(sh)} | {fmt(fo)} | {sh[1] / fo[1] if fo[1] else 0:.2f} "
                  f"| {shc[1]:,.0f} | {foc[1]:,.0f} |")
print()

reads = {}
for kind, f in rows:
    if kind == "read":
        cache = f.get("cache") or ("cold" if num(f, "resident_before") < 0.05 else "warm")
        reads.setdefault((f["format"], f["how"], cache), []).append(f)
if reads:
    print("Reads of one epoch's bytes (MB/s, best / median); loader = EpochSampleOrder, fadvise "
          "WILLNEED per batch, pread per sample; dd = each shard whole, bs=1M")
    print()
    print("| what | cold | warm |")
    print("|---|---|---|")
    for form, how in (("shards", "loader"), ("shards", "dd"), ("image_folder", "loader")):
        cells = []
        for cache in ("cold", "warm"):
            v = [num(f, "mb_per_s") for f in reads.get((form, how, cache), [])]
            cells.append(f"{max(v):.0f} / {statistics.median(v):.0f}" if v else "-")
        print(f"| {form}, {how} | {cells[0]} | {cells[1]} |")
    print()

for kind, f in rows:
    if kind == "profile" and f.get("system") == "torchvision":
        print(f"torchvision (pil), one process, us per image: read {f['read_us']}, decode (full) "
              f"{f['decode_us']}, RandomResizedCrop {f['resize_us']}, flip {f['flip_us']}, "
              f"PILToTensor {f['to_tensor_us']}; total {f['total_us']} "
              f"({1e6 / num(f, 'total_us'):.0f} images per CPU-s)")
    elif kind == "profile":
        print(f"Stoker {f['format']} ({f.get('decode', 'exact')}), one process, us per image: "
              f"read {f['read_us']}, decode of the crop box {f['decode_box_us']} "
              f"(box = {100 * num(f, 'box_fraction'):.0f}% of the pixels; DCT-scaled: "
              f"{int(f['denom2']) + int(f['denom4']) + int(f['denom8'])} of "
              f"{f['images']}), resize + flip + CHW {f['resize_us']}; transform "
              f"{f['transform_us']}; a full-size decode would be {f['full_decode_us']}, of which "
              f"entropy decoding {f['entropy_us']} (the crop decode entropy-decodes the rows down "
              f"to the box's bottom: {100 * num(f, 'rows_needed_fraction'):.0f}% of them on "
              f"average, ~{num(f, 'entropy_us') * num(f, 'rows_needed_fraction'):.0f} us)")
    elif kind == "profile_make":
        print(f"Stoker {f['format']} ({f.get('decode', 'exact')}), ImageBatchSource::Make in one "
              f"process (a loader without the ring): {num(f, 'images_per_s'):.0f} images/s, "
              f"{num(f, 'images_per_cpu_s'):.0f} per CPU-s")
PY

# Smoke mode: every throughput line (Stoker's and each peer's) counted the images after the first
# batch of one epoch, at a non-zero rate by the clock and per CPU-second.
smoke_check "$log" throughput:images=$((count * epochs - batch)) throughput:images_per_s\>0 \
  throughput:images_per_cpu_s\>0
