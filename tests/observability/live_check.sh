#!/usr/bin/env bash
# Starts a private Prometheus (1 s scrapes, the deploy's alert rules) that scrapes the given
# server and worker metrics endpoints, waits until both are up and have a few samples, then
# evaluates every dashboard and alert expression through it (promql_check.py).
#
# Usage: live_check.sh --server-metrics HOST:PORT --worker-metrics HOST:PORT [--wait SECONDS]
#                      [promql_check.py options, e.g. --require-data --allow-empty REGEX]
# Example with a real cluster (a job training):
#   tests/observability/live_check.sh --server-metrics 127.0.0.1:9100 \
#       --worker-metrics 127.0.0.1:9101 --require-data --allow-empty 'gpu_|loss_scale'
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
server="" worker="" wait_s=6 check_args=()
while (($#)); do
  case "$1" in
    --server-metrics) server="$2"; shift 2 ;;
    --worker-metrics) worker="$2"; shift 2 ;;
    --wait) wait_s="$2"; shift 2 ;;
    *) check_args+=("$1"); shift ;;
  esac
done
[[ -n "$server" && -n "$worker" ]] || { echo "usage: $0 --server-metrics H:P --worker-metrics H:P" >&2; exit 2; }
command -v prometheus >/dev/null || { echo "live_check: prometheus not installed (apt-get install prometheus)" >&2; exit 1; }

tmp="$(mktemp -d)"
prom_pid=""
cleanup() {
  if [[ -n "$prom_pid" ]]; then kill "$prom_pid" 2>/dev/null || true; wait "$prom_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

cp "$repo/deploy/prometheus/alerts.yml" "$tmp/alerts.yml"
cat > "$tmp/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [alerts.yml]
scrape_configs:
  - job_name: stoker-server
    static_configs: [{targets: ["$server"]}]
  - job_name: stoker-worker
    static_configs: [{targets: ["$worker"]}]
YAML
port="$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port"
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$port" >"$tmp/prometheus.log" 2>&1 &
prom_pid=$!

up_count() {
  curl -fsS --get "$url/api/v1/query" --data-urlencode 'query=sum(up)' 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)' 2>/dev/null || echo 0
}
for _ in $(seq 1 60); do
  [[ "$(up_count)" == 2 ]] && break
  kill -0 "$prom_pid" 2>/dev/null || { cat "$tmp/prometheus.log" >&2; echo "live_check: prometheus exited" >&2; exit 1; }
  sleep 0.5
done
if [[ "$(up_count)" != 2 ]]; then
  curl -fsS "$url/api/v1/targets" >&2 || true
  echo "live_check: targets $server and $worker not both up after 30 s" >&2
  exit 1
fi
sleep "$wait_s"  # a few scrapes, so rate() has two samples in its window
/usr/bin/python3 "$here/promql_check.py" --prometheus "$url" --rate-interval 5s "${check_args[@]}"
