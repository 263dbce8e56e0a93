#!/usr/bin/env bash
# Checks deploy/: Prometheus config and alert rules (promtool, including alert unit tests),
# compose files (docker-compose config), the dashboard's expressions against the metric names
# the code exports, and -- with --exporter -- evaluates every expression against a private
# Prometheus scraping real WorkerMetrics/ServerMetrics endpoints (obs_exporter).
#
# Usage: check_deploy.sh [--exporter PATH --fake-nvml PATH]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
exporter="" fake_nvml=""
while (($#)); do
  case "$1" in
    --exporter) exporter="$2"; shift 2 ;;
    --fake-nvml) fake_nvml="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
step() { echo; echo "== $*"; }

step "promtool"
command -v promtool >/dev/null ||
  { echo "promtool missing: apt-get install prometheus (scripts/setup.sh installs it)" >&2; exit 1; }
promtool check config "$repo/deploy/prometheus/prometheus.yml"
promtool check rules "$repo/deploy/prometheus/alerts.yml"
# Rule unit tests read alerts.yml relative to the test file.
tmp="$(mktemp -d)"
exporter_pid=""
cleanup() {
  if [[ -n "$exporter_pid" ]]; then kill "$exporter_pid" 2>/dev/null || true; wait "$exporter_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
cp "$repo/deploy/prometheus/alerts.yml" "$here/alerts_test.yml" "$tmp/"
(cd "$tmp" && promtool test rules alerts_test.yml)

step "docker-compose"
if command -v docker-compose >/dev/null; then
  docker-compose -f "$repo/deploy/docker-compose.yml" config -q
  docker-compose -f "$repo/deploy/docker-compose.yml" -f "$repo/deploy/docker-compose.cpu.yml" config -q
  echo "compose files valid (GPU and CPU variants)"
else
  echo "SKIPPED: docker-compose not installed (apt-get install docker-compose; scripts/setup.sh does)"
fi

step "dashboard"
/usr/bin/python3 -c 'import json,sys; [json.load(open(p)) for p in sys.argv[1:]]' \
  "$repo"/deploy/grafana/dashboards/*.json
sources=("$repo/worker/metrics/worker_metrics.cc" "$repo/server/metrics/server_metrics.cc")
/usr/bin/python3 "$here/promql_check.py" --known-metrics "${sources[@]}"
# The name check must catch a metric the code does not export.
printf '{"panels":[{"title":"t","targets":[{"expr":"rate(stoker_no_such_thing_total[1m])"}]}]}' \
  > "$tmp/bad.json"
if /usr/bin/python3 "$here/promql_check.py" --dashboard "$tmp/bad.json" \
     --rules "$repo/deploy/prometheus/alerts.yml" --known-metrics "${sources[@]}" >/dev/null; then
  echo "promql_check did not notice an unknown metric" >&2
  exit 1
fi

if [[ -z "$exporter" ]]; then
  echo; echo "no --exporter: live evaluation not run"
  exit 0
fi
step "live: Prometheus scraping WorkerMetrics and ServerMetrics"
"$exporter" --port-file "$tmp/ports" --nvml-library "$fake_nvml" --seconds 120 &
exporter_pid=$!
for _ in $(seq 1 50); do [[ -s "$tmp/ports" ]] && break; sleep 0.1; done
read -r server_port worker_port < "$tmp/ports"
# Everything is simulated, so every expression must return data.
"$here/live_check.sh" --server-metrics "127.0.0.1:$server_port" \
  --worker-metrics "127.0.0.1:$worker_port" --require-data
