#!/usr/bin/env bash
# One server's scheduling at scale (issue 29): bench/scheduler_scale_bench at 100, 300 and 1,000
# simulated workers (8 fake GPUs each), 50 users in 10 teams (quotas and weights on half of them),
# 20,000 queued jobs; heartbeat latency p50/p99, the server's scheduling pass times, submits/s and
# the server's peak RSS, and how each grows with the workers; once every GPU is busy, 50 jobs end
# a second (--finish_per_s) so that heartbeats keep placing.
# Usage: bench/run_scale.sh [BUILD_DIR]   Environment: WORKER_COUNTS (default "100 300 1000"),
#   JOBS (20000), SECONDS_PER_CONFIG (20). SMOKE=1: 10 workers, 200 jobs, 2 s.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
build="${1:-${STOKER_BUILD:-$root/build}}"
for program in bench/scheduler_scale_bench server/stoker-server; do
  [[ -x "$build/$program" ]] || { echo "no $build/$program: build it or pass BUILD_DIR" >&2; exit 1; }
done
counts="${WORKER_COUNTS:-100 300 1000}" jobs="${JOBS:-20000}" seconds="${SECONDS_PER_CONFIG:-20}"
[[ "$smoke" == 1 ]] && counts=10 jobs=200 seconds=2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
print_machine
print_load before
for workers in $counts; do
  "$build/bench/scheduler_scale_bench" --server_bin "$build/server/stoker-server" \
    --workers "$workers" --jobs "$jobs" --seconds "$seconds" | tee -a "$log"
done
print_load after
smoke_check "$log" submit:submits_per_s\>0 submit:errors=0 heartbeat:jobs_started\>0 \
  heartbeat:errors=0 server:hwm_kb\>0
/usr/bin/python3 - "$log" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    words = line.split()
    if not words:
        continue
    f = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if words[0] == "submit":
        current = rows.setdefault(len(rows), {})
        current["submit"] = f
    elif words[0] in ("heartbeat", "server", "phase"):
        rows[len(rows) - 1][words[0]] = f
    elif words[0] == "pass":
        rows[len(rows) - 1]["pass_" + f["kind"]] = f
print()
print("| workers | jobs | submits/s | heartbeat p50 ms | p99 ms | fill p99 ms | steady p50 / p99 ms "
      "| assign pass mean ms (p99 bucket) | preemption pass mean ms (p99 bucket) | jobs started "
      "(ended) | server peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows.values():
    h, s, ph = r.get("heartbeat", {}), r.get("server", {}), r.get("phase", {})
    a, p = r.get("pass_assign", {}), r.get("pass_preemption", {})
    cell = lambda x: f"{float(x.get('mean_ms', 0)):.1f} ({x.get('p99_bucket_ms', '-')})" if x else "-"
    print(f"| {h.get('workers')} | {h.get('jobs')} | {r['submit']['submits_per_s']} "
          f"| {h.get('p50_ms')} | {h.get('p99_ms')} | {ph.get('fill_p99_ms')} "
          f"| {ph.get('steady_p50_ms')} / {ph.get('steady_p99_ms')} | {cell(a)} | {cell(p)} "
          f"| {h.get('jobs_started')} ({ph.get('finished')}) | {int(s.get('hwm_kb', 0)) / 1024:.0f} |")
print("\nfill: until every GPU is busy; steady: after, with --finish_per_s jobs ending a second")
print("Targets (issue 29): heartbeat p99 <= 20 ms; a scheduling pass <= 50 ms at p99; "
      "submits no slower than ~1,600/s; server RSS <= 1 GiB")
PY
