# Sourced by the bench/run_*.sh scripts: where the programs they measure are.
# Needs $root (the repository).

# Sets `bench` to the benchmark program NAME: $2 when given (the script's first argument), else
# the first build/bench/NAME or build-*/bench/NAME; exits naming the target to build otherwise.
# EXTRA_TARGETS names other targets the message should mention.
find_bench() {  # NAME [GIVEN]
  local name=$1 candidate
  bench="${2:-}"
  if [[ -z "$bench" ]]; then
    for candidate in "$root"/build/bench/"$name" "$root"/build-*/bench/"$name"; do
      if [[ -x "$candidate" ]]; then bench="$candidate"; break; fi
    done
  fi
  if [[ -z "$bench" || ! -x "$bench" ]]; then
    echo "$name not found: build it (cmake --build build --target $name${EXTRA_TARGETS:+ $EXTRA_TARGETS}) or pass its path" >&2
    exit 1
  fi
}

# Sets server_bin, worker_bin, cli, trainer_bin, loader_bin and dataset_bin: from BIN_DIR ($1, a
# copy of an older build's binaries for a before/after comparison) or the build/ tree; exits
# naming the first that is missing (stoker-dataset only when NEED_DATASET_TOOL=1).
find_programs() {  # [BIN_DIR]
  local bin="${1:-}" b
  if [[ -n "$bin" ]]; then
    server_bin="$bin/stoker-server" worker_bin="$bin/stoker-worker" cli="$bin/stoker"
    trainer_bin="$bin/stoker-trainer" loader_bin="$bin/stoker-loader"
    dataset_bin="$bin/stoker-dataset"
  else
    server_bin="$root/build/server/stoker-server" worker_bin="$root/build/worker/stoker-worker"
    cli="$root/build/client/stoker" dataset_bin="$root/build/data/index/stoker-dataset"
    trainer_bin="$root/build/worker/stoker-trainer" loader_bin="$root/build/worker/stoker-loader"
  fi
  for b in "$server_bin" "$worker_bin" "$cli" "$trainer_bin" "$loader_bin"; do
    [[ -x "$b" ]] || { echo "not found: $b (build it, or pass a BIN_DIR)" >&2; exit 1; }
  done
  if [[ "${NEED_DATASET_TOOL:-0}" == 1 && ! -x "$dataset_bin" ]]; then
    echo "not found: $dataset_bin (build it, or pass a BIN_DIR)" >&2
    exit 1
  fi
}
