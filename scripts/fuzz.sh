#!/usr/bin/env bash
# Fuzzes the input parsers (IDX, NPY, CSV, job files, images, tar shards, brace patterns, prepared
# training sets) with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer, SECONDS per target (default 30).
#
# Usage: scripts/fuzz.sh [SECONDS]
#   Installs clang and its runtime if missing (apt, as scripts/setup.sh does), builds the targets
#   in build-fuzz/ (no CMake needed), seeds each run with fuzz/corpus/TARGET (read only) and keeps
#   what it finds in build-fuzz/corpus/TARGET. A crash, leak, timeout (> 10 s per input) or
#   out-of-memory (> 2 GiB) leaves its input in build-fuzz/artifacts/TARGET/ and makes the script
#   exit 1. Reproduce one with: build-fuzz/TARGET_fuzz build-fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS]" >&2
  exit 64
fi

packages=(clang libclang-rt-14-dev libabsl-dev zlib1g-dev pkg-config libprotobuf-dev
  protobuf-compiler libyaml-cpp-dev libjpeg62-turbo-dev libpng-dev libarchive-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

cxx="${FUZZ_CXX:-clang++}"
out=build-fuzz
mkdir -p "$out/obj"
sanitize=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
cxxflags=(-std=c++20 -g -O1 -I. -Wall -Wextra "${sanitize[@]}")
read -r -a libs <<<"$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format) -lz"

# The readers are compiled once, instrumented for coverage, and linked into every target.
readers=(file_bytes idx_reader npy_reader csv_reader dataset prepared_dataset)
start=$(date +%s)
pids=()
for r in "${readers[@]}"; do
  "$cxx" "${cxxflags[@]}" -fsanitize=fuzzer-no-link -c "data/$r.cc" -o "$out/obj/$r.o" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
objects=()
for r in "${readers[@]}"; do objects+=("$out/obj/$r.o"); done
targets=(idx npy csv prepared)
for t in "${targets[@]}"; do
  "$cxx" "${cxxflags[@]}" -fsanitize=fuzzer "fuzz/${t}_fuzz.cc" "${objects[@]}" "${libs[@]}" \
    -o "$out/${t}_fuzz"
done
# The job-file parser and JobSpec validation (with the generated protobuf code).
mkdir -p "$out/gen"
protoc --proto_path=proto --cpp_out="$out/gen" proto/stoker.proto
jobfile_sources=("$out/gen/stoker.pb.cc" spec/job_file.cc spec/job_spec.cc spec/search.cc common/utf8.cc)
read -r -a jobfile_libs <<<"$(pkg-config --libs protobuf yaml-cpp absl_status absl_statusor absl_strings absl_str_format)"
"$cxx" "${cxxflags[@]}" -I"$out/gen" -fsanitize=fuzzer fuzz/jobfile_fuzz.cc "${jobfile_sources[@]}" \
  "${jobfile_libs[@]}" -o "$out/jobfile_fuzz"
targets+=(jobfile)
# The image codecs and transforms (data/image) with libjpeg-turbo and libpng.
image_sources=(data/image/image_decoder.cc data/image/image_codec.cc data/image/image_resample.cc
  data/image/image_transform.cc data/image/jpeg_restart.cc)
"$cxx" "${cxxflags[@]}" -fsanitize=fuzzer fuzz/image_fuzz.cc "${image_sources[@]}" "${libs[@]}" \
  -ljpeg -lpng16 -o "$out/image_fuzz"
targets+=(image)
# Sample indexes (data/index): tar shards through libarchive and index files; brace patterns.
index_sources=(data/index/beneath.cc data/index/brace.cc data/index/index_format.cc data/index/sample_index.cc
  data/index/epoch_sample_order.cc data/index/image_folder_index.cc data/index/shard_index.cc
  data/epoch_order.cc)
read -r -a index_libs <<<"$(pkg-config --libs absl_flat_hash_set)"
"$cxx" "${cxxflags[@]}" -fsanitize=fuzzer fuzz/tar_index_fuzz.cc "${index_sources[@]}" "${libs[@]}" \
  "${index_libs[@]}" -larchive -o "$out/tar_index_fuzz"
"$cxx" "${cxxflags[@]}" -fsanitize=fuzzer fuzz/brace_fuzz.cc data/index/brace.cc "${libs[@]}" \
  -o "$out/brace_fuzz"
targets+=(tar_index brace)
echo "fuzz: built ${targets[*]} in $(($(date +%s) - start)) s with $("$cxx" --version | head -1)"

failed=()
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
  dict=()
  [[ -f "fuzz/$t.dict" ]] && dict=(-dict="fuzz/$t.dict")
  log="$out/$t.log"
  status=0
  # The outer timeout: libFuzzer's own report of a hung input once deadlocked in its handler
  # (the process slept for good), which would hang the whole test run.
  timeout --kill-after=10 $((seconds + 120)) \
    "$out/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" "${dict[@]}" \
    "$out/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 || status=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  corpus=$(find "$out/corpus/$t" -type f | wc -l)
  if ((status == 0)); then
    echo "fuzz: $t ok: $runs inputs in ${seconds} s, coverage $cov edges, corpus $corpus files"
  else
    ((status == 124 || status == 137)) && echo "fuzz: $t did not end (a hang; killed)"
    echo "fuzz: $t FAILED (exit $status), see $log; inputs in $out/artifacts/$t/:"
    grep -E '^==[0-9]+==ERROR|SUMMARY|runtime error|ALARM|out-of-memory' "$log" | head -5 || true
    ls "$out/artifacts/$t/" || true
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failures in ${failed[*]}"
  exit 1
fi
echo "fuzz: no crashes, leaks, timeouts or out-of-memory in ${targets[*]}"
