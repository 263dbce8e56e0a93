#!/usr/bin/env bash
# The web page's job list at 10,000 jobs: a stoker-server with --web-listen, two users in two
# teams with 5,000 queued jobs each (submit_bench), then bench/web_pages.py times the pages as the
# user (the team filter in SQL) and as the cluster admin (every job): the first page, a walk of
# 40 pages through the "older" links, the last page reached, a state filter and a job page.
# Usage: bench/run_web.sh [BUILD_DIR]   (default build/)
#   SMOKE=1: 300 jobs, a short walk; fails unless every page was served.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
build=${1:-$root/build}
per_user=5000 walk=40 repeat=20
[[ "$smoke" == 1 ]] && per_user=300 walk=5 repeat=3
for program in server/stoker-server bench/submit_bench client/stoker; do
  [[ -x "$build/$program" ]] || { echo "no $build/$program: build it or pass BUILD_DIR" >&2; exit 1; }
done
dir=$(mktemp -d)
trap 'kill $server_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/server/stoker-server" --listen 127.0.0.1:0 --port-file "$dir/port" --state-dir "$dir/state" \
  --web-listen 127.0.0.1:0 >"$dir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
[[ -s "$dir/port" ]] || { cat "$dir/server.log"; echo "stoker-server did not start" >&2; exit 1; }
server="127.0.0.1:$(cat "$dir/port")"
web="http://127.0.0.1:$(grep -o 'web page on port [0-9]*' "$dir/server.log" | grep -o '[0-9]*$')"
"$build/server/stoker-server" bootstrap-admin --state-dir "$dir/state" --user root \
  --token-out "$dir/root.token" 2>/dev/null
cli() { "$build/client/stoker" --server "$server" --token-file "$dir/root.token" "$@" >/dev/null; }
cli team create vision
cli team create nlp
cli user add alice --team vision --token-out "$dir/alice.token"
cli user add dave --team nlp --token-out "$dir/dave.token"
print_machine
for user in alice dave; do
  "$build/bench/submit_bench" --server "$server" --clients 4 --jobs "$per_user" \
    --token-file "$dir/$user.token" | grep '^submit ' | tee -a "$dir/log"
done
python3 "$here/web_pages.py" "$web" "$dir/alice.token" user --walk "$walk" --repeat "$repeat" \
  | tee -a "$dir/log"
python3 "$here/web_pages.py" "$web" "$dir/root.token" admin --all --walk "$walk" --repeat "$repeat" \
  | tee -a "$dir/log"
smoke_check "$dir/log" submit:errors=0 web_pages:rows_per_page=50 web_pages:pages_walked="$walk"
