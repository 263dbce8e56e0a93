#!/usr/bin/env bash
# The GPU check, in one script, for a machine with an NVIDIA GPU (written for the nvidia-h200 kind:
# 16 cores, CUDA 13 with nvcc, CMake, ninja and g++, no network). It
#   1. configures the standalone build tests/gpu/CMakeLists.txt (Release, sm_90; cuDNN from the
#      toolkit, CUDNN_ROOT, or the pip package nvidia-cudnn-cu13) and builds only
#      cuda_conformance_test, cuda_network_test, gpu_bench and engine_test with -j16;
#   2. runs engine_test (the cpu reference's own tests), the cuda conformance tests (the MLP fast
#      path and its CUDA graphs, cuda vs cpu), the network tests (cuDNN conv/pool, GELU, dropout,
#      AdamW, clipping, fp16, cuda vs cpu), a safetensors-library check of a Stoker checkpoint,
#      and gpu_bench (step time fp32/bf16/fp16, TFLOP/s, plain cuBLASLt GEMM of the same shape,
#      CUDA graph vs kernel by kernel);
#   3. prints a short table last. Logs go to $OUT if set (the device tool's output folder), else
#      to the build folder.
# Needs: nvcc (CUDACXX or /usr/local/cuda/bin/nvcc), cmake >= 3.25, g++, and Abseil, GoogleTest
# and oneDNN with its OpenCL loader. When those three are missing it unpacks the archive that
# tests/gpu/bundle_deps.sh makes on the Debian development machine (carry the folder
# build-gpu-deps with the call); as a last resort it tries apt-get, which needs a network.
# Installs nothing else. Budget: about 2 minutes of build and 1 of runs; hard limits below keep
# the whole script under 8 minutes.
#
#   bash tests/gpu/check.sh [build-dir]      (default: build-gpu-check)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu-check}
LOGS=${OUT:-$BUILD/logs}
JOBS=${JOBS:-16}
BUNDLE=${STOKER_GPU_DEPS:-$ROOT/build-gpu-deps/stoker-gpu-deps.tar.gz}
mkdir -p "$BUILD" "$LOGS"
start=$(date +%s)
log() { echo "[check.sh +$(( $(date +%s) - start ))s] $*"; }

if [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader | tee "$LOGS/gpu.txt"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)

configure() {
  cmake -S "$ROOT/tests/gpu" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release "$@" \
    >>"$LOGS/configure.log" 2>&1
}

log "configure"
: >"$LOGS/configure.log"
if ! configure; then
  if [[ -f "$BUNDLE" ]]; then
    log "system Abseil/GoogleTest/oneDNN missing: using $BUNDLE"
    DEPS=/tmp/stoker-gpu-deps
    rm -rf "$DEPS" && mkdir -p "$DEPS" && tar -C "$DEPS" -xzf "$BUNDLE"
    cat "$DEPS/VERSIONS" 2>/dev/null
    export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
    configure -DCMAKE_PREFIX_PATH="$DEPS/usr" || { log "configure failed"; tail -30 "$LOGS/configure.log"; exit 1; }
  elif command -v apt-get >/dev/null; then
    log "dependencies missing and no bundle: trying apt-get (needs a network)"
    timeout 180 apt-get install -y libabsl-dev libgtest-dev libdnnl-dev >>"$LOGS/configure.log" 2>&1
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
    configure || { log "configure failed"; tail -30 "$LOGS/configure.log"; exit 1; }
  else
    log "configure failed and no $BUNDLE"; tail -30 "$LOGS/configure.log"; exit 1
  fi
fi

log "build -j$JOBS"
# cuDNN from pip keeps its sub-libraries (libcudnn_cnn.so.9, ...) beside libcudnn.so.9: the loader
# must find them at run time.
CUDNN_LIB_DIR=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null)
if [[ -n "$CUDNN_LIB_DIR" && -d "$CUDNN_LIB_DIR" ]]; then
  export LD_LIBRARY_PATH="$CUDNN_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
grep -E "stoker: cuDNN" "$LOGS/configure.log" | tail -1
targets=(cuda_conformance_test gpu_bench engine_test)
grep -q "stoker: cuDNN not found" "$LOGS/configure.log" || targets+=(cuda_network_test)
if ! timeout 210 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" \
    >"$LOGS/build.log" 2>&1; then
  log "build failed"; grep -E "error|Error" "$LOGS/build.log" | head -40; exit 1
fi

log "engine_test"
OMP_WAIT_POLICY=passive timeout 45 "$BUILD/engine/engine_test" --gtest_brief=1 \
  >"$LOGS/engine_test.log" 2>&1
engine_rc=$?
log "cuda_conformance_test"
OMP_WAIT_POLICY=passive timeout 60 "$BUILD/cuda/cuda_conformance_test" \
  --gtest_output="xml:$LOGS/conformance.xml" >"$LOGS/conformance.log" 2>&1
conformance_rc=$?
grep -E "^\[  (FAILED|SKIPPED) |Failure|error" "$LOGS/conformance.log" | head -40
log "cuda_network_test"
network_rc=1
if [[ -x "$BUILD/cuda/cuda_network_test" ]]; then
  OMP_WAIT_POLICY=passive timeout 60 "$BUILD/cuda/cuda_network_test" \
    --gtest_output="xml:$LOGS/network.xml" >"$LOGS/network.log" 2>&1
  network_rc=$?
  grep -E "^\[  (FAILED|SKIPPED) |Failure|error" "$LOGS/network.log" | head -60
else
  echo "cuda_network_test not built (no cuDNN found)" | tee "$LOGS/network.log"
fi
log "safetensors"
# A Stoker checkpoint (written on the Debian machine) read with the safetensors library, which that
# machine lacks: identical tensors to Stoker's own reading, and the weights load into torch.nn.
timeout 20 python3 "$ROOT/scripts/pytorch_eval.py" --verify \
  "$ROOT/tests/gpu/fixture-cnn-fp16-adamw.safetensors" >"$LOGS/safetensors.log" 2>&1
safetensors_rc=$?
cat "$LOGS/safetensors.log"
log "gpu_bench"
timeout 90 "$BUILD/cuda/bench_gpu/gpu_bench" >"$LOGS/gpu_bench.log" 2>&1
bench_rc=$?
cat "$LOGS/gpu_bench.log"

summary() {  # gtest log -> "passed N failed N skipped N"
  local p f s
  p=$(grep -oE "^\[  PASSED  \] [0-9]+" "$1" | grep -oE "[0-9]+$" || echo 0)
  f=$(grep -oE "^\[  FAILED  \] [0-9]+ test" "$1" | grep -oE "[0-9]+" || echo 0)
  s=$(grep -oE "^\[  SKIPPED \] [0-9]+ test" "$1" | grep -oE "[0-9]+" || echo 0)
  echo "passed ${p:-0} failed ${f:-0} skipped ${s:-0}"
}
value() {  # value LINE_PREFIX KEY
  grep -E "^$1" "$LOGS/gpu_bench.log" | head -1 | grep -oE "(^| )$2=[^ ]+" | cut -d= -f2
}

{
  echo
  echo "| check | result |"
  echo "|---|---|"
  echo "| engine_test (rc $engine_rc) | $(summary "$LOGS/engine_test.log") |"
  echo "| cuda_conformance_test (rc $conformance_rc) | $(summary "$LOGS/conformance.log") |"
  echo "| cuda_network_test (rc $network_rc) | $(summary "$LOGS/network.log") |"
  echo "| safetensors library loads a Stoker checkpoint (rc $safetensors_rc) | $(head -1 "$LOGS/safetensors.log" | cut -c1-60) |"
  echo "| gpu_bench (rc $bench_rc) | $(head -2 "$LOGS/gpu_bench.log" | tr '\n' ' ') |"
  echo
  echo "| precision | step ms | samples/s | TFLOP/s |"
  echo "|---|---|---|---|"
  for p in fp32 bf16 fp16; do
    echo "| $p | $(value "step precision=$p" ms) | $(value "step precision=$p" samples_per_s) | $(value "step precision=$p" tflops) |"
  done
  echo "| cuBLASLt bf16 GEMM $(value gemm shape) | $(value gemm ms) | | $(value gemm tflops) |"
  echo
  echo "| example CNN (cuDNN), batch 512 | step ms | samples/s |"
  echo "|---|---|---|"
  for p in fp32 bf16 fp16; do
    echo "| $p | $(value "cnn precision=$p" ms) | $(value "cnn precision=$p" samples_per_s) |"
  done
  echo
  echo "small MLP (784-784-10, batch 128, bf16) step ms: CUDA graph $(value "small precision=bf16 graphs=1" ms), kernel by kernel $(value "small precision=bf16 graphs=0" ms) ($(value speedup graphs_vs_eager_small)x)"
  echo
  echo "bf16 vs fp32 speedup: $(value speedup bf16_vs_fp32)x; bf16 step / GEMM TFLOP/s: $(value ratio bf16_step_vs_gemm); total $(( $(date +%s) - start )) s"
} | tee "$LOGS/summary.md"
[[ $engine_rc -eq 0 && $conformance_rc -eq 0 && $network_rc -eq 0 && $safetensors_rc -eq 0 &&
  $bench_rc -eq 0 ]]
