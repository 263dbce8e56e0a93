#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts a local stoker-server and one
# stoker-worker on loopback, trains the Fashion-MNIST MLP (examples/fashion-mnist-mlp.yaml) with a
# live progress display, prints its test accuracy, and stops what it started.
# Usage: scripts/run-example.sh [JOB_FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
job_file=${1:-examples/fashion-mnist-mlp.yaml}
scripts/setup.sh

state=.stoker/example
mkdir -p "$state"
port_file="$state/server.port"
rm -f "$port_file"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

build/server/stoker-server --listen 127.0.0.1:0 --port-file "$port_file" \
  --state-dir "$state/server" --data-root /usr/share/datasets >"$state/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
[ -s "$port_file" ] || { echo "stoker-server did not start; see $state/server.log"; exit 1; }
server="127.0.0.1:$(cat "$port_file")"

build/worker/stoker-worker --server "$server" --work-dir "$state/worker" \
  --data-root /usr/share/datasets >"$state/worker.log" 2>&1 &
pids+=($!)

echo "server $server, worker logs in $state/; submitting $job_file"
build/client/stoker --server "$server" submit --follow "$job_file"
