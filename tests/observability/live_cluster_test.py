#!/usr/bin/python3
"""Observability against a real cluster: a stoker-server and a stoker-worker serving /metrics on
loopback while real jobs train.

1. A real Prometheus scrapes both while a job trains, and every PromQL expression of the Grafana
   dashboard and of the alert rules is evaluated and must return data (live_check.sh), except the
   GPU and fp16 loss-scale series that a CPU-only machine cannot have.
2. The stall demonstration, read from the worker's /metrics counters: with one slow loader
   (loader.delay_ms) the input-bound fraction rate(stall) / rate(stall + busy) is above 0.5; with
   enough loader processes it drops below 0.1. The loader delay is derived from a step measured on
   this machine at this moment (6 steps' worth), so a loaded or fast machine changes the delay,
   not the outcome: one loader then supplies a sixth of what the trainer consumes, sixteen supply
   2.7 times as much.

Usage: live_cluster_test.py --bin-dir BUILD_DIR --source-dir REPO
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return response.read().decode()


def counter_sum(text, name, job_id):
    """Sum of a metric's samples labelled job_id=<job_id>."""
    total = 0.0
    pattern = re.compile(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m and f'job_id="{job_id}"' in m.group(1):
            total += float(m.group(2))
    return total


class Cluster:
    def __init__(self, bin_dir, work):
        self.bin_dir, self.work, self.procs = bin_dir, work, []
        self.grpc_port = free_port()
        self.server_metrics = f"127.0.0.1:{free_port()}"
        self.worker_metrics = f"127.0.0.1:{free_port()}"

    def start(self, name, argv):
        log = open(os.path.join(self.work, name + ".log"), "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def up(self):
        b = self.bin_dir
        self.start("server", [f"{b}/server/stoker-server", "--listen", f"127.0.0.1:{self.grpc_port}",
                              "--state-dir", f"{self.work}/server",
                              "--metrics-listen", self.server_metrics])
        time.sleep(0.5)
        self.start("worker", [f"{b}/worker/stoker-worker", "--server", f"127.0.0.1:{self.grpc_port}",
                              "--worker-id", "obs-worker", "--work-dir", f"{self.work}/worker",
                              "--metrics-listen", self.worker_metrics])

    def cli(self, *args):
        return subprocess.run([f"{self.bin_dir}/client/stoker", "--server",
                               f"127.0.0.1:{self.grpc_port}", *args],
                              capture_output=True, text=True, timeout=60)

    def submit(self, job_yaml, name):
        path = os.path.join(self.work, name + ".yaml")
        with open(path, "w") as f:
            f.write(job_yaml)
        result = self.cli("submit", path)
        m = re.search(r"submitted (j-\d+)", result.stdout)
        if not m:
            sys.exit(f"submit failed: {result.stdout}{result.stderr}")
        return m.group(1)

    def state(self, job_id):
        result = self.cli("--output", "json", "status", job_id)
        m = re.search(r'"state": "JOB_STATE_(\w+)"', result.stdout)
        return m.group(1) if m else "?"

    def wait_running(self, job_id, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                text = scrape(self.worker_metrics)
            except OSError:  # the worker has not bound its /metrics port yet (slow start under load)
                text = ""
            if counter_sum(text, "stoker_samples_total", job_id) > 0:
                return
            time.sleep(0.2)
        sys.exit(f"{job_id} did not start training (state {self.state(job_id)})")

    def wait_final(self, job_id, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.state(job_id)
            if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return state
            time.sleep(0.5)
        return "TIMEOUT"

    def down(self):
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


JOB = """name: {name}
dataset:
  train_images: fashion-mnist/train-images-idx3-ubyte.gz
  train_labels: fashion-mnist/train-labels-idx1-ubyte.gz
  test_images: fashion-mnist/t10k-images-idx3-ubyte.gz
  test_labels: fashion-mnist/t10k-labels-idx1-ubyte.gz
  train_limit: {train_limit}
  test_limit: 1000
model: {{type: mlp, hidden: {hidden}}}
train: {{epochs: {epochs}, batch_size: {batch}, precision: {precision}}}
loader: {{processes: {loaders}, ring_slots: 16, delay_ms: {delay}}}
"""


def increments(cluster, job_id, names, window_s):
    """How much each of the job's counters `names` grew over `window_s` (two worker scrapes)."""
    before = scrape(cluster.worker_metrics)
    time.sleep(window_s)
    after = scrape(cluster.worker_metrics)
    return [counter_sum(after, n, job_id) - counter_sum(before, n, job_id) for n in names]


def step_seconds(cluster, job_id, window_s):
    """Mean compute time of one training step over `window_s` (busy seconds / steps)."""
    busy, steps = increments(cluster, job_id, ["stoker_device_busy_seconds_total",
                                               "stoker_step_seconds_count"], window_s)
    if steps <= 0:
        sys.exit(f"{job_id}: no step in {window_s} s")
    return busy / steps


def wait_ring_filled(cluster, job_id, slots, timeout=60):
    """Waits until the ring holds `slots` filled slots: every loader has started and caught up."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if counter_sum(scrape(cluster.worker_metrics), "stoker_ring_filled_slots", job_id) >= slots:
            return
        time.sleep(0.2)
    sys.exit(f"{job_id}: the ring never held {slots} filled slots in {timeout} s")


def input_bound_fraction(cluster, job_id, window_s):
    """rate(stall) / rate(stall + busy) over `window_s`, from two scrapes of the worker."""
    stall, busy = increments(cluster, job_id, ["stoker_data_stall_seconds_total",
                                               "stoker_device_busy_seconds_total"], window_s)
    if stall + busy <= 0:
        sys.exit(f"{job_id}: no stall or busy time advanced in {window_s} s")
    return stall / (stall + busy), stall, busy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    if shutil.which("prometheus") is None:
        sys.exit("prometheus is not installed (scripts/setup.sh installs it)")
    work = tempfile.mkdtemp(prefix="stoker-obs-")
    cluster = Cluster(os.path.abspath(args.bin_dir), work)
    failures = []
    try:
        cluster.up()
        # 1. Every dashboard and alert expression returns data while a job trains.
        # fp16, so the loss-scale and skipped-step series exist too, and two data-parallel ranks
        # of one core each, so the all-reduce series do; only GPU series cannot. The job's own
        # series leave /metrics when it ends, so it must outlast the check: 2,000 epochs, far more
        # than the check takes, then cancelled (30 epochs had finished in 12 s on a fast host).
        job = cluster.submit(JOB.format(name="obs", train_limit=12000, hidden="[256]", epochs=2000,
                                        batch=128, loaders=1, delay=5, precision="fp16")
                             + "resources: {cpus: 1, replicas: 2}\n", "obs")
        cluster.wait_running(job)
        check = subprocess.run(
            [os.path.join(args.source_dir, "tests/observability/live_check.sh"),
             "--server-metrics", cluster.server_metrics, "--worker-metrics", cluster.worker_metrics,
             # No GPUs here, and no team has a quota in this cluster.
             "--require-data", "--allow-empty", "gpu_", "--allow-empty", "stoker_team_quota"],
            capture_output=True, text=True, timeout=180)
        print(check.stdout[-4000:], check.stderr[-2000:])
        if check.returncode != 0:
            failures.append("live_check.sh failed")
        state = cluster.state(job)
        if state != "RUNNING":
            failures.append(f"the obs job was {state} by the end of the check, not running: "
                            "its per-job series had gone")
        cluster.cli("cancel", job)
        cluster.wait_final(job, 30)

        # 2. Stall demonstration. First the step this machine takes now, with loaders that never
        # wait; then the same job with one slow loader and with sixteen, each loader sleeping six
        # steps' worth per batch.
        stall_job = dict(train_limit=60000, hidden="[1024, 1024]", epochs=20, batch=256,
                         precision="fp32")
        job = cluster.submit(JOB.format(name="stall-calibrate", loaders=8, delay=0, **stall_job),
                             "stall-calibrate")
        cluster.wait_running(job)
        time.sleep(2)
        step_ms = 1000 * step_seconds(cluster, job, 4)
        cluster.cli("cancel", job)
        cluster.wait_final(job, 30)
        delay_ms = min(max(round(6 * step_ms), 20), 5000)
        print(f"stall demonstration: step {step_ms:.1f} ms, loader.delay_ms {delay_ms}")
        fractions = {}
        for loaders in (1, 16):
            name = f"stall-{loaders}"
            job = cluster.submit(JOB.format(name=name, loaders=loaders, delay=delay_ms, **stall_job),
                                 name)
            cluster.wait_running(job)
            if loaders == 1:
                time.sleep(3)  # loader start-up (it unzips the dataset) is not the steady state
            else:
                wait_ring_filled(cluster, job, 8)  # all sixteen started and ahead of the trainer
            fraction, stall, busy = input_bound_fraction(cluster, job, 6)
            fractions[loaders] = fraction
            print(f"{name}: input-bound fraction {fraction:.3f} "
                  f"(stall {stall:.2f} s, busy {busy:.2f} s over 6 s)")
            cluster.cli("cancel", job)
            cluster.wait_final(job, 30)
        if not fractions[1] > 0.5:
            failures.append(f"one slow loader: input-bound fraction {fractions[1]:.3f}, want > 0.5")
        if not fractions[16] < 0.1:
            failures.append(f"sixteen loaders: input-bound fraction {fractions[16]:.3f}, "
                            "want < 0.1")
    finally:
        cluster.down()
        if failures:
            for name in ("server", "worker"):
                with open(os.path.join(work, name + ".log")) as f:
                    print(f"---- {name}.log (tail)\n" + f.read()[-3000:])
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("FAILED:", *failures, sep="\n  ")
        return 1
    print("live cluster observability: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
