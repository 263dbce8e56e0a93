#!/usr/bin/env bash
# Durable submit throughput: starts a stoker-server on a fresh store, runs submit_bench with 8
# clients and 2000 jobs, prints the result line. Usage: bench/run_submit.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
dir=$(mktemp -d)
trap 'kill $server_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/server/stoker-server" --listen 127.0.0.1:0 --port-file "$dir/port" --state-dir "$dir/state" \
  >"$dir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
"$build/bench/submit_bench" --server "127.0.0.1:$(cat "$dir/port")" --clients 8 --jobs 2000
