#!/usr/bin/env bash
# Durable submit throughput: starts a stoker-server on a fresh store, runs submit_bench with 8
# clients and 2000 jobs, prints the result line.
# Usage: bench/run_submit.sh [BUILD_DIR]   (default build/)
#   SMOKE=1: 2 clients, 50 jobs; fails unless every job was stored once at a non-zero rate.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
build=${1:-$root/build}
clients=8 jobs=2000
[[ "$smoke" == 1 ]] && clients=2 jobs=50
for program in server/stoker-server bench/submit_bench; do
  [[ -x "$build/$program" ]] || { echo "no $build/$program: build it or pass BUILD_DIR" >&2; exit 1; }
done
dir=$(mktemp -d)
trap 'kill $server_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/server/stoker-server" --listen 127.0.0.1:0 --port-file "$dir/port" --state-dir "$dir/state" \
  >"$dir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
[[ -s "$dir/port" ]] || { cat "$dir/server.log"; echo "stoker-server did not start" >&2; exit 1; }
print_machine
"$build/bench/submit_bench" --server "127.0.0.1:$(cat "$dir/port")" --clients "$clients" \
  --jobs "$jobs" | tee "$dir/log"
smoke_check "$dir/log" submit:submits_per_s\>0 submit:stored="$jobs" submit:errors=0 \
  submit:duplicated=0
