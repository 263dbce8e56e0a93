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
# Server and worker run in sessions of their own (setsid), so a Ctrl-C reaches only this script,
# which stops them in order below.
pids=()
server=""
cleanup() {
  # Interrupted: cancel what this run left queued or running, so the next run does not start by
  # finishing it. Then the worker (it drains), then the server.
  if [ -n "$server" ]; then
    build/client/stoker --server "$server" list --state queued --state running 2>/dev/null |
      awk '$1 ~ /^j-/ {print $1}' | while read -r id; do
        build/client/stoker --server "$server" cancel "$id" >/dev/null 2>&1 || true
      done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

setsid build/server/stoker-server --listen 127.0.0.1:0 --port-file "$port_file" \
  --state-dir "$state/server" --data-root /usr/share/datasets >"$state/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
[ -s "$port_file" ] || { echo "stoker-server did not start; see $state/server.log"; exit 1; }
server="127.0.0.1:$(cat "$port_file")"

setsid build/worker/stoker-worker --server "$server" --work-dir "$state/worker" \
  --data-root /usr/share/datasets >"$state/worker.log" 2>&1 &
pids+=($!)

echo "server $server, worker logs in $state/; submitting $job_file"
build/client/stoker --server "$server" submit --follow "$job_file"
