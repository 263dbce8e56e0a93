#!/usr/bin/env bash
# The deployment, for real: builds the images with podman (deploy/podman-build.sh), starts the
# server, a CPU worker and Prometheus (Debian's package) with docker-compose through podman's
# Docker-compatible socket, with TLS, the admin token and the worker's join token from
# deploy/make-secrets.sh, then from the host's CLI:
#   1. submits the Fashion-MNIST MLP example; once it has trained a few epochs, stops the worker
#      container (`docker-compose stop`: SIGTERM, the agent drains) and checks that the job is
#      back in the queue with a checkpoint; starts the worker again and checks that the job
#      resumes from that checkpoint (not from step 0) and succeeds with the usual accuracy;
#   2. downloads the weights with `stoker artifact` (and scores them in PyTorch when
#      /usr/bin/python3 has torch);
#   3. checks the images' healthchecks and that Prometheus inside the stack scrapes both services;
#   4. recreates the server container and finds the job in the store (the `state` volume).
# Everything it starts (containers, volumes, network, the podman service) is removed on exit.
# Exits 77 (ctest SKIP) when podman, docker-compose or the local base image debian:12 is missing.
#
# Usage: compose_test.sh [--cli build/client/stoker] [--keep-images]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cli="$repo/build/client/stoker"
while (($#)); do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
skip() { echo "SKIPPED: $*"; exit 77; }
setup_hint="deploy/README.md, 'With podman': apt-get install podman runc, then deploy/podman-setup.sh"
command -v podman >/dev/null ||
  skip "podman is not installed; to run this test: $setup_hint (installs the network stack with DNS and makes the base images without a registry)"
command -v docker-compose >/dev/null ||
  skip "docker-compose is not installed (apt-get install docker-compose; scripts/setup.sh and deploy/podman-setup.sh do)"
podman image exists debian:12 && podman image exists debian:12-slim ||
  skip "podman has no debian:12 / debian:12-slim image: run deploy/podman-setup.sh (makes them with mmdebstrap) or podman pull them"
# Without DNS on the compose network the worker cannot find `server`: say so now rather than
# after the image builds. (deploy/podman-setup.sh proves resolution end to end.)
network_backend=$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null || echo unknown)
case "$network_backend" in
  netavark) dns_piece=/usr/lib/podman/aardvark-dns ;;
  cni) dns_piece=/usr/lib/cni/dnsname ;;
  *) dns_piece="" ;;
esac
[[ -z "$dns_piece" || -x "$dns_piece" ]] ||
  { echo "FAIL: podman's network stack ($network_backend) has no DNS ($dns_piece is missing), so compose services cannot resolve each other: run deploy/podman-setup.sh ($setup_hint)" >&2; exit 1; }
[[ -x "$cli" ]] || { echo "no CLI at $cli (build the stoker target)" >&2; exit 1; }

start_time=$SECONDS
step() { echo; echo "== [$((SECONDS - start_time)) s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

tmp="$(mktemp -d /tmp/stoker-deploy-test.XXXXXX)"
project="stokerdeploytest$$"
service_pid=""
compose_files=(-f "$repo/deploy/docker-compose.yml" -f "$repo/deploy/docker-compose.cpu.yml"
               -f "$repo/deploy/docker-compose.debian-prometheus.yml")
compose() { docker-compose -p "$project" "${compose_files[@]}" "$@"; }
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$service_pid" ]]; then
    if ((rc != 0)); then
      echo "== logs (test failed)"
      compose logs --no-color --tail 60 2>&1 | tail -200
    fi
    compose down -v --remove-orphans -t 5 >/dev/null 2>&1
    kill "$service_pid" 2>/dev/null
    wait "$service_pid" 2>/dev/null
  fi
  # Whatever compose could not remove (a failed start): by the project's label.
  podman rm -f $(podman ps -aq --filter "label=com.docker.compose.project=$project") >/dev/null 2>&1
  podman volume rm $(podman volume ls -q --filter "label=com.docker.compose.project=$project") >/dev/null 2>&1
  podman network rm "${project}_default" >/dev/null 2>&1
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
export STOKER_GRPC_PORT STOKER_PROMETHEUS_PORT STOKER_GRAFANA_PORT STOKER_WEB_PORT
STOKER_GRPC_PORT=$(free_port)
STOKER_WEB_PORT=$(free_port)
STOKER_PROMETHEUS_PORT=$(free_port)
STOKER_GRAFANA_PORT=$(free_port)
export STOKER_SECRETS_DIR="$tmp/secrets"
export STOKER_DATA=/usr/share/datasets
[[ -s "$STOKER_DATA/fashion-mnist/t10k-labels-idx1-ubyte.gz" ]] ||
  fail "no Fashion-MNIST in $STOKER_DATA (apt-get install dataset-fashion-mnist)"

# A copy: the build tree's binary may be relinked while the test runs.
cp "$cli" "$tmp/stoker"
cli="$tmp/stoker"
"$cli" --help >/dev/null || fail "$cli does not run"

step "secrets (deploy/make-secrets.sh into $STOKER_SECRETS_DIR)"
"$repo/deploy/make-secrets.sh"
stoker() {
  "$cli" --server "127.0.0.1:$STOKER_GRPC_PORT" --tls-ca "$STOKER_SECRETS_DIR/stoker_tls_cert.pem" \
    --token-file "$STOKER_SECRETS_DIR/stoker_admin_token" "$@"
}
# FIELD of a job's protobuf JSON (the CLI keeps the proto field names), e.g. state,
# checkpoint_step, progress.test_accuracy; 0 when absent (proto3 JSON leaves out zero values).
job_field() {  # JOB FIELD
  stoker status "$1" -o json | /usr/bin/python3 -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1].split("."):
    value = value.get(key, 0) if isinstance(value, dict) else 0
print(value)' "$2"
}

step "images (deploy/podman-build.sh)"
"$repo/deploy/podman-build.sh"
build_seconds=$((SECONDS - start_time))
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' |
  grep -E 'stoker-(server|worker-cpu|prometheus):latest' || true

step "podman's Docker-compatible service on $tmp/podman.sock"
podman system service -t 0 "unix://$tmp/podman.sock" &
service_pid=$!
export DOCKER_HOST="unix://$tmp/podman.sock"
for _ in $(seq 1 50); do [[ -S "$tmp/podman.sock" ]] && break; sleep 0.2; done
[[ -S "$tmp/podman.sock" ]] || fail "podman system service did not create its socket"

step "compose up: server, worker-cpu, prometheus (project $project, gRPC 127.0.0.1:$STOKER_GRPC_PORT)"
compose up -d --no-build server worker-cpu prometheus
# Fails fast when the worker cannot resolve the server's name: once the server answers here, a
# worker that has logged twice (several seconds apart) that `server` does not resolve is on a
# network without DNS; a single miss can be the server container not being up yet.
server_answered=0
for _ in $(seq 1 60); do
  if workers=$(stoker workers -o json 2>/dev/null); then server_answered=1; else workers=""; fi
  [[ "$workers" == *workerId* || "$workers" == *worker_id* ]] && break
  if ((server_answered)); then
    unresolved=$(compose logs --no-color worker-cpu 2>&1 | grep "host name 'server' does not resolve" || true)
    if (($(grep -c . <<<"$unresolved") >= 2)); then
      fail "the worker cannot resolve the server's name on the compose network, while the server answers on the host:
$(tail -n 1 <<<"$unresolved")
The network has no DNS: run deploy/podman-setup.sh ($setup_hint), then 'docker-compose down' so that compose makes its network again."
    fi
  fi
  sleep 1
done
[[ "$workers" == *workerId* || "$workers" == *worker_id* ]] ||
  fail "no worker registered within 60 s: $(stoker workers 2>&1)
worker log: $(compose logs --no-color --tail 5 worker-cpu 2>&1)"
stoker workers
# Plaintext or a wrong token must be refused.
if "$cli" --server "127.0.0.1:$STOKER_GRPC_PORT" --token-file "$STOKER_SECRETS_DIR/stoker_admin_token" \
     workers >/dev/null 2>&1; then
  fail "the server answered a plaintext connection"
fi
echo wrong-token > "$tmp/wrong_token"
if "$cli" --server "127.0.0.1:$STOKER_GRPC_PORT" --tls-ca "$STOKER_SECRETS_DIR/stoker_tls_cert.pem" \
     --token-file "$tmp/wrong_token" workers >/dev/null 2>&1; then
  fail "the server accepted a wrong token"
fi

# The worker joined with the join token; it cannot be used twice, and the admin is a cluster
# admin that sees the join in the audit log.
compose logs --no-color worker-cpu 2>&1 | grep -q "joined as" ||
  fail "the worker did not join with the join token: $(compose logs --no-color --tail 5 worker-cpu 2>&1)"
stoker whoami | grep -q "admin (cluster admin)" || fail "whoami: $(stoker whoami 2>&1)"
stoker audit | grep -q "worker.join " || fail "no worker.join row in: $(stoker audit 2>&1)"
if "$cli" --server "127.0.0.1:$STOKER_GRPC_PORT" --tls-ca "$STOKER_SECRETS_DIR/stoker_tls_cert.pem" \
     --token-file "$STOKER_SECRETS_DIR/stoker_join_token" workers >/dev/null 2>&1; then
  fail "the join token acted as a user"
fi

step "healthchecks"
for service in server worker-cpu prometheus; do
  id=$(compose ps -q "$service")
  user=$(podman inspect -f '{{.Config.User}}' "$id")
  result=$(podman healthcheck run "$id" 2>&1) || fail "$service healthcheck: $result"
  echo "$service: healthcheck ${result:-healthy}, user ${user:-root}"
done
[[ "$(podman inspect -f '{{.Config.User}}' "$(compose ps -q server)")" == stoker ]] ||
  fail "the server runs as root"
[[ "$(podman inspect -f '{{.Config.User}}' "$(compose ps -q worker-cpu)")" == stoker ]] ||
  fail "the worker runs as root"

# The MLP example with 30 epochs instead of 10: on a fast machine its 10 epochs take ~6 s, and the
# job finished between the last progress poll and the worker's stop.
step "submit examples/fashion-mnist-mlp.yaml (30 epochs)"
sed 's/^  epochs: 10$/  epochs: 30/' "$repo/examples/fashion-mnist-mlp.yaml" > "$tmp/mlp-30.yaml"
grep -q '^  epochs: 30$' "$tmp/mlp-30.yaml" || fail "examples/fashion-mnist-mlp.yaml has no 'epochs: 10' line"
job=$(stoker submit "$tmp/mlp-30.yaml" -o json |
      /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r.get("job", r)["id"])')
echo "job $job"
# Let it train two epochs (of 30), then stop the worker mid-job.
for _ in $(seq 1 300); do
  epoch=$(job_field "$job" progress.epoch)
  state=$(job_field "$job" state)
  ((epoch >= 2)) && break
  [[ "$state" == JOB_STATE_QUEUED || "$state" == JOB_STATE_RUNNING ]] || fail "job is $state"
  sleep 1
done
((epoch >= 2)) || fail "job did not reach epoch 2 in 300 s"
[[ "$(job_field "$job" state)" == JOB_STATE_RUNNING ]] || fail "job not running at epoch $epoch"
step_at_stop=$(job_field "$job" progress.step)
total_steps=$(job_field "$job" progress.total_steps)
echo "running: epoch $epoch, step $step_at_stop of $total_steps"

step "web page over HTTPS (127.0.0.1:$STOKER_WEB_PORT): sign in, the job list, the job's curves"
web="https://127.0.0.1:$STOKER_WEB_PORT"
signin=$(curl -sS -i --cacert "$STOKER_SECRETS_DIR/stoker_tls_cert.pem" \
  --data-urlencode "token@$STOKER_SECRETS_DIR/stoker_admin_token" "$web/login" | tr -d '\r') ||
  fail "the web page does not answer on $web"
cookie=$(grep -i '^set-cookie: stoker_session=' <<<"$signin" | sed 's/^[^:]*: //; s/;.*//')
[[ -n "$cookie" ]] || fail "signing in gave no session cookie: $(head -5 <<<"$signin")"
grep -qi '^set-cookie:.*; Secure' <<<"$signin" || fail "the session cookie is not Secure over TLS"
curl -fsS --cacert "$STOKER_SECRETS_DIR/stoker_tls_cert.pem" -H "Cookie: $cookie" "$web/jobs?all=1" |
  grep -q "data-job=\"$job\"" || fail "the job list does not show $job"
curl -fsS --cacert "$STOKER_SECRETS_DIR/stoker_tls_cert.pem" -H "Cookie: $cookie" "$web/jobs/$job" |
  grep -q 'id="chart-accuracy"' || fail "the job page of $job has no accuracy chart"
echo "signed in as admin; $job is listed and its page has its charts"

step "compose stop worker-cpu mid-job (drain)"
stop_start=$SECONDS
compose stop worker-cpu
echo "stopped in $((SECONDS - stop_start)) s"
state=$(job_field "$job" state)
checkpoint_step=$(job_field "$job" checkpoint_step)
echo "job after stop: $state, checkpoint at step $checkpoint_step"
[[ "$state" == JOB_STATE_QUEUED ]] || fail "job is $state after the worker stopped, not queued"
((checkpoint_step >= step_at_stop && checkpoint_step < total_steps)) ||
  fail "checkpoint at step $checkpoint_step, expected one at or after step $step_at_stop"
[[ "$(podman inspect -f '{{.State.ExitCode}}' "$(compose ps -q worker-cpu)")" == 0 ]] ||
  fail "the worker did not exit cleanly (exit $(podman inspect -f '{{.State.ExitCode}}' "$(compose ps -q worker-cpu)"))"

step "compose start worker-cpu: the job resumes and finishes"
compose start worker-cpu
for _ in $(seq 1 600); do
  state=$(job_field "$job" state)
  [[ "$state" == JOB_STATE_QUEUED || "$state" == JOB_STATE_RUNNING ]] || break
  sleep 1
done
stoker status "$job"
[[ "$state" == JOB_STATE_SUCCEEDED ]] || fail "job ended $state: $(job_field "$job" error)"
accuracy=$(job_field "$job" progress.test_accuracy)
/usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 0.87 else 1)' "$accuracy" ||
  fail "test accuracy $accuracy < 0.87 (the MLP example reaches ~0.89)"
# The second attempt started from the checkpoint: its first progress report is past the step the
# first attempt was stopped at, and the steps add up to the plan.
stoker logs "$job" -o json > "$tmp/events.jsonl"
/usr/bin/python3 - "$tmp/events.jsonl" "$checkpoint_step" "$total_steps" <<'PY'
import json, sys
checkpoint, total = int(sys.argv[2]), int(sys.argv[3])
text = open(sys.argv[1]).read()
try:  # one object {"events": [...]}, or JSON lines
    whole = json.loads(text)
    events = whole.get("events", []) if isinstance(whole, dict) else whole
except json.JSONDecodeError:
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
progress = [(e.get("attempt", 0), int(e["progress"].get("step", 0))) for e in events
            if e.get("type") in ("EVENT_TYPE_PROGRESS", "EVENT_TYPE_EPOCH") and "progress" in e]
attempts = sorted({a for a, _ in progress})
if len(attempts) < 2:
    sys.exit(f"expected progress from two attempts, got attempts {attempts}")
later = [s for a, s in progress if a == attempts[-1]]
if min(later) <= checkpoint:
    sys.exit(f"attempt {attempts[-1]} reported step {min(later)}: did not resume after step {checkpoint}")
if max(later) != total:
    sys.exit(f"the job ended at step {max(later)}, planned {total}")
messages = [(e.get("attempt", 0), e.get("message", "")) for e in events]
if not any(f"stopped at step {checkpoint} for the worker's shutdown" in m for _, m in messages):
    sys.exit(f"no event says the first attempt stopped at step {checkpoint} for the shutdown")
if not any(a == attempts[-1] and f"resumed from the checkpoint at step {checkpoint}" in m
           for a, m in messages):
    sys.exit(f"no event says attempt {attempts[-1]} resumed from the checkpoint at step {checkpoint}")
print(f"attempts {attempts}: the last resumed after step {checkpoint} (first report at step "
      f"{min(later)}) and ended at step {max(later)} of {total}")
PY
echo "test accuracy $accuracy"

step "stoker artifact"
stoker artifact "$job" -o "$tmp/model.safetensors"
[[ -s "$tmp/model.safetensors" ]] || fail "stoker artifact wrote nothing"
ls -l "$tmp/model.safetensors"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  eval_line=$(/usr/bin/python3 "$repo/scripts/pytorch_eval.py" "$tmp/model.safetensors")
  echo "PyTorch: $eval_line"
  # The same weights scored outside Stoker: the accuracy the server reported, to rounding.
  /usr/bin/python3 -c '
import sys
torch_accuracy = float(sys.argv[1].split()[0].split("=")[1])
sys.exit(0 if abs(torch_accuracy - float(sys.argv[2])) <= 0.002 else 1)' "$eval_line" "$accuracy" ||
    fail "PyTorch scores the downloaded weights as: $eval_line (Stoker: $accuracy)"
else
  echo "PyTorch not installed for /usr/bin/python3: the downloaded weights are not scored"
fi

step "Prometheus inside the stack scrapes the server and the worker"
prometheus="http://127.0.0.1:$STOKER_PROMETHEUS_PORT"
for _ in $(seq 1 90); do
  targets=$(curl -fsS "$prometheus/api/v1/targets" 2>/dev/null || true)
  up=$(/usr/bin/python3 -c '
import json, sys
try: targets = json.loads(sys.argv[1])["data"]["activeTargets"]
except Exception: targets = []
print(" ".join(sorted({t["labels"]["job"] for t in targets if t["health"] == "up"})))' "$targets")
  [[ "$up" == "stoker-server stoker-worker" ]] && break
  sleep 1
done
echo "targets up: ${up:-none}"
[[ "$up" == "stoker-server stoker-worker" ]] || fail "Prometheus targets: $targets"
samples=$(curl -fsS "$prometheus/api/v1/query" --data-urlencode \
  'query=stoker_rpc_requests_total{method=~".*Heartbeat.*"}' | /usr/bin/python3 -c '
import json, sys; print(len(json.load(sys.stdin)["data"]["result"]))')
((samples > 0)) || fail "Prometheus holds no stoker_rpc_requests_total for Heartbeat"
echo "server series scraped: stoker_rpc_requests_total (Heartbeat): $samples"

step "the job store survives recreating the server container"
old_id=$(compose ps -q server)
compose up -d --no-build --no-deps --force-recreate server
new_id=$(compose ps -q server)
[[ "$old_id" != "$new_id" ]] || fail "the server container was not recreated"
for _ in $(seq 1 60); do
  state=$(job_field "$job" state 2>/dev/null || true)
  [[ -n "$state" && "$state" != 0 ]] && break
  sleep 1
done
[[ "$state" == JOB_STATE_SUCCEEDED ]] || fail "after recreation the job is '$state'"
[[ "$(job_field "$job" progress.test_accuracy)" == "$accuracy" ]] ||
  fail "after recreation the job's accuracy changed"
stoker artifact "$job" -o "$tmp/again.safetensors"
cmp "$tmp/model.safetensors" "$tmp/again.safetensors" || fail "the stored weights changed"
echo "job $job still succeeded with accuracy $accuracy in a new server container"

step "PASS (images ${build_seconds} s, whole test $((SECONDS - start_time)) s)"
