# Sourced by the bench/run_*.sh scripts: where the programs they measure are, a local cluster to
# run jobs on, and the machine and load lines of their reports. Needs $root (the repository).

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

# Prints "machine: <CPU model>, <cores> cores; <UTC time>".
print_machine() {
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
}

# Prints "load average WHEN: <1, 5 and 15 minute averages>".
print_load() {  # WHEN
  echo "load average $1: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# Starts a stoker-server on loopback and one stoker-worker (WORKER_ID, work dir $state/worker),
# both serving DATA_ROOT, with their logs in $state; appends their pids to `pids` and sets
# `server` (host:port) and `worker_pid`. Needs find_programs' variables, $state and `pids`; exits
# with the server's log when it does not start.
start_local_cluster() {  # DATA_ROOT WORKER_ID
  local data_root=$1 worker_id=$2
  setsid "$server_bin" --listen 127.0.0.1:0 --port-file "$state/server.port" \
    --state-dir "$state/server" --data-root "$data_root" >"$state/server.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [[ -s "$state/server.port" ]] && break; sleep 0.1; done
  [[ -s "$state/server.port" ]] || { cat "$state/server.log"; echo "stoker-server did not start" >&2; exit 1; }
  server="127.0.0.1:$(cat "$state/server.port")"
  setsid "$worker_bin" --server "$server" --worker-id "$worker_id" --work-dir "$state/worker" \
    --data-root "$data_root" --trainer "$trainer_bin" --loader "$loader_bin" \
    >"$state/worker.log" 2>&1 &
  worker_pid=$!
  pids+=($worker_pid)
}

# Kills the processes in `pids`, the last started first, and waits for each.
stop_pids() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
