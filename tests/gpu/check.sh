#!/usr/bin/env bash
# The GPU check, in one script, for a machine with an NVIDIA GPU (written for the nvidia-h200 kind:
# 16 cores, CUDA 13 with nvcc, CMake, ninja and g++, no network). It
#   1. configures the standalone build tests/gpu/CMakeLists.txt (Release, sm_90; cuDNN from the
#      toolkit, CUDNN_ROOT, or the pip package nvidia-cudnn-cu13) and builds only
#      cuda_conformance_test, cuda_network_test, cuda_vision_layers_test, comm_nccl_test,
#      gpu_bench and engine_test with -j16;
#   2. runs engine_test (the cpu reference's own tests), the cuda conformance tests (the MLP fast
#      path and its CUDA graphs, cuda vs cpu), the network tests (cuDNN conv/pool, GELU, dropout,
#      AdamW, clipping, fp16, cuda vs cpu), the vision layers (BatchNorm, average pooling,
#      residual blocks, bias-free layers, label smoothing, data-parallel hand-over; cuda vs cpu),
#      comm_nccl_test when NCCL is found (one NCCL rank on device 0: the collective, the device
#      gradient reducer with its timeout and abort, the cuda MLP training through it), a
#      safetensors-library check of a Stoker checkpoint (in the background from the start: a
#      cold `import torch` takes a while), and gpu_bench (step time fp32/bf16/fp16, TFLOP/s,
#      plain cuBLASLt GEMM of the same shape, CUDA graph vs kernel by kernel);
#   3. prints a short table last.
# Nothing passes vacuously: STOKER_REQUIRE_CUDA=1 makes a device the runtime cannot see a test
# failure (with the CUDA error) instead of a skip, any skipped cuda test fails the check, a test
# binary that ran no test fails it, and gpu_bench exits non-zero on any error.
# Logs are written under the build folder (logs/); at the end, whatever happened, summary.md and
# one archive of the logs, logs.tar.gz, are put into $OUT if set (the device tool's output
# folder, which brings back only a few files), else into the build folder.
# Needs: nvcc (CUDACXX or /usr/local/cuda/bin/nvcc), cmake >= 3.25, g++, and Abseil, GoogleTest
# and oneDNN with its OpenCL loader. When those three are missing it unpacks the archive that
# tests/gpu/bundle_deps.sh makes on the Debian development machine (carry the folder
# build-gpu-deps with the call); as a last resort it tries apt-get, which needs a network.
# Installs nothing else. Budget: about 2 minutes of build and 2 of runs; the hard limits below
# add up to 570 s (build 210 s; engine_test 45, conformance 50, network 65, vision 40, NCCL 70,
# gpu_bench 90), under the device tool's 600 s for one call.
#
#   bash tests/gpu/check.sh [build-dir]      (default: build-gpu-check)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu-check}
LOGS=$BUILD/logs
RESULTS=${OUT:-$BUILD}
JOBS=${JOBS:-16}
BUNDLE=${STOKER_GPU_DEPS:-$ROOT/build-gpu-deps/stoker-gpu-deps.tar.gz}
mkdir -p "$BUILD" "$RESULTS"
rm -rf "$LOGS" && mkdir -p "$LOGS"
start=$(date +%s)
log() { echo "[check.sh +$(( $(date +%s) - start ))s] $*"; }
export STOKER_REQUIRE_CUDA=1

# On every exit: summary.md (saying where the check stopped, if it did) and the logs archive.
stage=start
finish() {
  local rc=$?
  if [[ ! -s "$LOGS/summary.md" ]]; then
    echo "check.sh stopped (rc $rc) at: $stage; see logs.tar.gz" >"$LOGS/summary.md"
  fi
  cp "$LOGS/summary.md" "$RESULTS/summary.md"
  tar -C "$BUILD" -czf "$RESULTS/logs.tar.gz" logs
}
trap finish EXIT

# A Stoker checkpoint (written on the Debian machine) read with the safetensors library, which that
# machine lacks: identical tensors to Stoker's own reading, and the weights load into torch.nn.
# Started first, in the background: it needs no build, and a cold `import torch` can take a
# minute or more.
( timeout 120 python3 "$ROOT/scripts/pytorch_eval.py" --verify \
    "$ROOT/tests/gpu/fixture-cnn-fp16-adamw.safetensors" >"$LOGS/safetensors.log" 2>&1
  echo $? >"$LOGS/safetensors.rc" ) &
safetensors_pid=$!

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
stage=configure
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
stage=build
# cuDNN from pip keeps its sub-libraries (libcudnn_cnn.so.9, ...) beside libcudnn.so.9: the loader
# must find them at run time.
CUDNN_LIB_DIR=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null)
if [[ -n "$CUDNN_LIB_DIR" && -d "$CUDNN_LIB_DIR" ]]; then
  export LD_LIBRARY_PATH="$CUDNN_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
grep -E "stoker: cuDNN" "$LOGS/configure.log" | tail -1
targets=(cuda_conformance_test gpu_bench engine_test)
grep -q "stoker: cuDNN not found" "$LOGS/configure.log" ||
  targets+=(cuda_network_test cuda_vision_layers_test)
grep -q "comm_nccl_test not built" "$LOGS/configure.log" || targets+=(comm_nccl_test)
if ! timeout 210 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" \
    >"$LOGS/build.log" 2>&1; then
  log "build failed"; grep -E "error|Error" "$LOGS/build.log" | head -40; exit 1
fi

log "engine_test"
stage=tests
OMP_WAIT_POLICY=passive timeout 45 "$BUILD/engine/cpu/engine_test" --gtest_brief=1 \
  >"$LOGS/engine_test.log" 2>&1
engine_rc=$?

# skipped LOG XML: how many tests the gtest run skipped (the larger of the log's and the XML's
# counts, so neither a truncated log nor a missing XML hides one).
skipped() {
  local from_log from_xml
  from_log=$(grep -oE "^\[  SKIPPED \] [0-9]+ test" "$1" | grep -oE "[0-9]+" | head -1)
  from_xml=$(grep -c "<skipped" "$2" 2>/dev/null)
  from_log=${from_log:-0} from_xml=${from_xml:-0}
  echo $(( from_log > from_xml ? from_log : from_xml ))
}
# run_cuda_test NAME BINARY SECONDS [ARGS...]: runs a cuda gtest binary; its rc is 1 also when a test was
# skipped or none passed (a vacuous run).
run_cuda_test() {
  local name=$1 binary=$2 seconds=$3 rc passed count
  shift 3
  OMP_WAIT_POLICY=passive timeout "$seconds" "$binary" "$@" --gtest_output="xml:$LOGS/$name.xml" \
    >"$LOGS/$name.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|SKIPPED) |Failure|error" "$LOGS/$name.log" | head -40 >&2
  count=$(skipped "$LOGS/$name.log" "$LOGS/$name.xml")
  passed=$(grep -oE "^\[  PASSED  \] [0-9]+" "$LOGS/$name.log" | grep -oE "[0-9]+$" | head -1)
  if ((rc == 0 && count > 0)); then
    echo "check.sh: $name skipped $count test(s): the check needs every cuda test to run" \
      | tee -a "$LOGS/$name.log" >&2
    rc=1
  fi
  if ((rc == 0 && ${passed:-0} == 0)); then
    echo "check.sh: $name passed no test" | tee -a "$LOGS/$name.log" >&2
    rc=1
  fi
  return "$rc"
}
log "cuda_conformance_test"
run_cuda_test conformance "$BUILD/cuda/cuda_conformance_test" 50
conformance_rc=$?
log "cuda_network_test"
network_rc=1
if [[ -x "$BUILD/cuda/cuda_network_test" ]]; then
  run_cuda_test network "$BUILD/cuda/cuda_network_test" 65
  network_rc=$?
else
  echo "cuda_network_test not built (no cuDNN found)" | tee "$LOGS/network.log"
fi
log "cuda_vision_layers_test"
vision_rc=1
if [[ -x "$BUILD/cuda/cuda_vision_layers_test" ]]; then
  run_cuda_test vision "$BUILD/cuda/cuda_vision_layers_test" 40
  vision_rc=$?
else
  echo "cuda_vision_layers_test not built (no cuDNN found)" | tee "$LOGS/vision.log"
fi
log "comm_nccl_test (one rank on device 0: NCCL collective, gradient reducer, cuda MLP through it)"
nccl_rc=1
if [[ -x "$BUILD/comm_nccl_test" ]]; then
  NCCL_LIB_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null)
  # The two-device test skips on one GPU and the no-device test skips with one: run the rest.
  LD_LIBRARY_PATH="${NCCL_LIB_DIR:+$NCCL_LIB_DIR:}${LD_LIBRARY_PATH:-}" \
    run_cuda_test nccl "$BUILD/comm_nccl_test" 70 --gtest_filter=-*TwoDevices*:*WithoutADevice*
  nccl_rc=$?
else
  echo "comm_nccl_test not built (no NCCL found)" | tee "$LOGS/nccl.log"
fi
log "gpu_bench"
stage=gpu_bench
timeout 90 "$BUILD/cuda/bench_gpu/gpu_bench" >"$LOGS/gpu_bench.log" 2>&1
bench_rc=$?
cat "$LOGS/gpu_bench.log"
log "safetensors"
stage=safetensors
wait "$safetensors_pid"
safetensors_rc=$(cat "$LOGS/safetensors.rc" 2>/dev/null || echo 1)
cat "$LOGS/safetensors.log"
stage=summary

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
  echo "| cuda_conformance_test (rc $conformance_rc; skips fail) | $(summary "$LOGS/conformance.log") |"
  echo "| cuda_network_test (rc $network_rc; skips fail) | $(summary "$LOGS/network.log") |"
  echo "| cuda_vision_layers_test (rc $vision_rc; skips fail) | $(summary "$LOGS/vision.log") |"
  echo "| comm_nccl_test: collective, reducer, MLP data-parallel, one rank (rc $nccl_rc; skips fail) | $(summary "$LOGS/nccl.log") |"
  echo "| safetensors library loads a Stoker checkpoint (rc $safetensors_rc) | $(head -1 "$LOGS/safetensors.log" | cut -c1-60) |"
  echo "| gpu_bench (rc $bench_rc) | $(head -2 "$LOGS/gpu_bench.log" | tr '\n' ' ') $(grep -oE "errors=[0-9]+" "$LOGS/gpu_bench.log" | head -1) |"
  echo
  echo "| precision | step ms | samples/s | TFLOP/s |"
  echo "|---|---|---|---|"
  for p in fp32 bf16 fp16; do
    echo "| $p | $(value "step precision=$p" ms) | $(value "step precision=$p" samples_per_s) | $(value "step precision=$p" tflops) |"
  done
  echo "| cuBLASLt bf16 GEMM $(value gemm shape) | $(value gemm ms) | | $(value gemm tflops) |"
  echo
  echo "bf16 step fast paths: fused GEMMs $(value "step precision=bf16" fused_gemms), plain GEMMs $(value "step precision=bf16" plain_gemms), graph replays $(value "step precision=bf16" graph_replays), eager steps $(value "step precision=bf16" eager_steps)"
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
[[ $engine_rc -eq 0 && $conformance_rc -eq 0 && $network_rc -eq 0 && $vision_rc -eq 0 &&
  $safetensors_rc -eq 0 &&
  $bench_rc -eq 0 && $nccl_rc -eq 0 ]]
