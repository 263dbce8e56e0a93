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
# copy of an older build's binaries for a before/after comparison) or the build tree
# ($STOKER_BUILD, default build/); exits
# naming the first that is missing (stoker-dataset only when NEED_DATASET_TOOL=1).
find_programs() {  # [BIN_DIR]
  local bin="${1:-}" b
  if [[ -n "$bin" ]]; then
    server_bin="$bin/stoker-server" worker_bin="$bin/stoker-worker" cli="$bin/stoker"
    trainer_bin="$bin/stoker-trainer" loader_bin="$bin/stoker-loader"
    dataset_bin="$bin/stoker-dataset"
  else
    local tree="${STOKER_BUILD:-$root/build}"
    server_bin="$tree/server/stoker-server" worker_bin="$tree/worker/stoker-worker"
    cli="$tree/client/stoker" dataset_bin="$tree/data/index/stoker-dataset"
    trainer_bin="$tree/worker/stoker-trainer" loader_bin="$tree/worker/stoker-loader"
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

# Smoke mode (SMOKE=1): every bench/run_*.sh runs in a second or two on tiny sizes, one round,
# to show that it still works, not how fast anything is; the README's test command runs each one
# so (bench/CMakeLists.txt, label bench_smoke). The peers' side runs in smoke mode only where
# they are installed (bench/peers/install.sh) and SMOKE_PEERS is not 0. A smoke run ends with
# smoke_check on its log: it fails on a zero rate or a wrong sample count.
smoke="${SMOKE:-0}"

# Sets `peer_python` (the Python that runs the peers: $PEER_PYTHON, else the virtual environment
# bench/peers/install.sh makes, $STOKER_PEERS_VENV or bench/peers/venv) and `peers` (1 when the
# peers' side runs). Outside smoke mode the peers must be installed: exits saying how otherwise.
# PEER_PYTHON=/usr/bin/python3 measures Debian's PyTorch 1.13 instead (the old figures).
find_peers() {
  local venv="${STOKER_PEERS_VENV:-$root/bench/peers/venv}"
  peer_python="${PEER_PYTHON:-$venv/bin/python}"
  peers=1
  if [[ ! -x "$peer_python" ]] || ! "$peer_python" -c 'import torch' 2>/dev/null; then
    if [[ "$smoke" == 1 ]]; then
      peers=0
      echo "smoke: peers not installed ($peer_python): Stoker's side only"
      return
    fi
    echo "the peers are not installed at $peer_python: run bench/peers/install.sh (or set" \
      "PEER_PYTHON to a Python with torch)" >&2
    exit 1
  fi
  [[ "$smoke" == 1 && "${SMOKE_PEERS:-1}" == 0 ]] && peers=0
  # The versions (5 s of imports) only where the figures count.
  [[ "$smoke" == 1 ]] || "$peer_python" "$root/bench/peers/versions.py"
}

# Smoke mode's verdict on a log of key=value lines whose KIND is the first word without "=":
# each rule KIND:FIELD>0 needs at least one line of KIND and FIELD > 0 on every such line; KIND:FIELD=N
# needs FIELD == N (a number, or else the same text) on every line of KIND. Exits 1 naming the
# broken rule. No-op outside smoke mode.
smoke_check() {  # LOG RULE...
  [[ "$smoke" == 1 ]] || return 0
  /usr/bin/python3 - "$@" <<'PY'
import re
import sys

rows = []
for line in open(sys.argv[1]):
    words = line.split()
    bare = [w for w in words if "=" not in w]
    if bare:
        rows.append((bare[0], dict(w.split("=", 1) for w in words if "=" in w)))
failed = []


def equal(value, want):
    try:
        return float(value) == float(want)
    except ValueError:
        return value == want


for rule in sys.argv[2:]:
    kind, field, op, want = re.fullmatch(r"([\w.-]+):(\w+)(>|=)(.+)", rule).groups()
    lines = [f for k, f in rows if k == kind]
    if not lines:
        failed.append(f"{rule}: no '{kind}' line in the log")
        continue
    for f in lines:
        value = f.get(field)
        if value is None:
            failed.append(f"{rule}: a '{kind}' line has no {field}")
        elif op == ">" and not float(value) > float(want):
            failed.append(f"{rule}: {kind} {field}={value}")
        elif op == "=" and not equal(value, want):
            failed.append(f"{rule}: {kind} {field}={value}, expected {want}")
for message in failed:
    print(f"smoke check FAILED: {message}", file=sys.stderr)
if failed:
    sys.exit(1)
print(f"smoke check passed: {' '.join(sys.argv[2:])}")
PY
}
