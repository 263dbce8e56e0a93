#!/usr/bin/env bash
# Memory of a job's loader processes while it trains: starts a local stoker-server and one
# stoker-worker on loopback, runs the Fashion-MNIST MLP job (the whole 60000-sample training set)
# with loader.processes K = 1, 2, 4 (fixed, not auto), samples every running loader's
# /proc/PID/status (RssAnon, RssFile, RssShmem) and /proc/PID/smaps_rollup (Pss) while the job
# trains, cancels it, and prints a table against the size of the decoded training set.
#
# Usage: bench/run_loader_memory.sh [BIN_DIR]
#   Builds nothing. BIN_DIR holds stoker-server, stoker-worker, stoker-trainer, stoker-loader and
#   stoker (the CLI), e.g. a copy of an older build's binaries for a before/after comparison;
#   default: the build/ tree (cmake --build build --target stoker-server stoker-worker stoker).
#   Environment:
#     LOADERS         loader counts to measure (default "1 2 4")
#     SAMPLE_SECONDS  how long each job is sampled once it trains (default 5)
#     DATA_ROOT       where fashion-mnist/ lies (default /usr/share/datasets)
#     SMOKE=1         K = 1 sampled for 1 s; checks that the job trained and the loader was seen
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
find_programs "${1:-}"
data_root="${DATA_ROOT:-/usr/share/datasets}"
loaders="${LOADERS:-1 2 4}" sample_seconds="${SAMPLE_SECONDS:-5}"
[[ "$smoke" == 1 ]] && loaders=1 sample_seconds=1
[[ -f "$data_root/fashion-mnist/train-images-idx3-ubyte.gz" ]] ||
  { echo "no Fashion-MNIST under $data_root (apt install dataset-fashion-mnist)" >&2; exit 1; }

state="$(mktemp -d /tmp/stoker-loader-memory-XXXXXX)"
pids=()
cleanup() {
  stop_pids
  rm -rf "$state"
}
log="$state/log"
trap cleanup EXIT INT TERM

start_local_cluster "$data_root" bench-memory

echo "binaries: $(dirname "$loader_bin") (stoker-loader $(stat -c %y "$loader_bin" | cut -d. -f1))"
print_machine

PYTHONPATH="$here" /usr/bin/python3 - "$cli" "$server" "$state" "$loaders" \
  "$sample_seconds" <<'PY' | tee "$log"
import os
import sys
import time

from benchlib import job_pids, proc_kb, stoker_cli, write_job_file

cli, server, state, loaders, sample_seconds = sys.argv[1:6]
loader_counts = [int(k) for k in loaders.split()]
sample_seconds = float(sample_seconds)
work_dir = os.path.join(state, "worker")
MIB = 1024.0 * 1024.0
COUNT, SAMPLE_BYTES = 60000, 28 * 28
dataset_bytes = COUNT * (SAMPLE_BYTES + 1)  # decoded samples and labels


stoker = stoker_cli(cli, server)


def job_file(k):
    return write_job_file(os.path.join(state, f"job-{k}.yaml"), f"""name: loader-memory-k{k}
dataset: {{format: idx, classes: 10,
          train_images: fashion-mnist/train-images-idx3-ubyte.gz,
          train_labels: fashion-mnist/train-labels-idx1-ubyte.gz,
          test_images: fashion-mnist/t10k-images-idx3-ubyte.gz,
          test_labels: fashion-mnist/t10k-labels-idx1-ubyte.gz}}
model: {{type: mlp, hidden: [256, 128]}}
train: {{epochs: 100, batch_size: 128, precision: fp32, seed: 1,
         optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}}}
loader: {{processes: {k}, ring_slots: 8}}
resources: {{gpus: 0}}
""")


def loader_pids(job_id):
    return job_pids(work_dir, job_id)


def memory(pid):
    """kB values of RssAnon, RssFile, RssShmem and Pss, or None once the process is gone."""
    try:
        values = proc_kb(pid, "status", ("RssAnon", "RssFile", "RssShmem"))
        values.update(proc_kb(pid, "smaps_rollup", ("Pss",)))
    except OSError:
        return None
    return values if len(values) == 4 else None


rows = []
for k in loader_counts:
    job_id = stoker("submit", job_file(k))["job"]["id"]
    # Wait until it trains (steps done) with all K loaders running.
    deadline = time.time() + 120
    while True:
        status = stoker("status", job_id)
        if status.get("state") in ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                                   "JOB_STATE_SUCCEEDED"):
            sys.exit(f"job {job_id} ended before it was measured: {status.get('error', '')}")
        step = int(status.get("progress", {}).get("step", 0))
        if step > 0 and len(loader_pids(job_id)) == k:
            break
        if time.time() > deadline:
            sys.exit(f"job {job_id}: no training with {k} loaders after 120 s")
        time.sleep(0.2)
    # Sample: per loader, the largest value seen; totals are the largest per-sample sums.
    peak = {}
    total_anon = total_pss = 0
    samples = 0
    end = time.time() + sample_seconds
    while time.time() < end:
        sums = {"RssAnon": 0, "Pss": 0}
        pids = loader_pids(job_id)
        seen = 0
        for pid in pids:
            m = memory(pid)
            if m is None:
                continue
            seen += 1
            for key, v in m.items():
                peak.setdefault(pid, {}).setdefault(key, 0)
                peak[pid][key] = max(peak[pid][key], v)
            sums["RssAnon"] += m["RssAnon"]
            sums["Pss"] += m["Pss"]
        if seen == k:
            samples += 1
            total_anon = max(total_anon, sums["RssAnon"])
            total_pss = max(total_pss, sums["Pss"])
        time.sleep(0.25)
    step_end = int(stoker("status", job_id).get("progress", {}).get("step", 0))
    stoker("cancel", job_id)
    deadline = time.time() + 60
    while loader_pids(job_id) and time.time() < deadline:
        time.sleep(0.2)
    for pid, m in sorted(peak.items()):
        print(f"loader job={job_id} k={k} pid={pid} rss_anon_kb={m['RssAnon']} "
              f"rss_file_kb={m['RssFile']} rss_shmem_kb={m['RssShmem']} pss_kb={m['Pss']}")
    print(f"job job={job_id} k={k} samples={samples} steps_at_end={step_end} "
          f"total_rss_anon_kb={total_anon} total_pss_kb={total_pss}")
    rows.append((k, peak, total_anon, total_pss, samples))

print()
print(f"Fashion-MNIST training set decoded: {COUNT} x ({SAMPLE_BYTES} + 1) bytes = "
      f"{dataset_bytes / MIB:.1f} MiB. Per-loader values: the largest seen while the job trained "
      f"({sample_seconds:g} s, every 0.25 s); totals: the largest sum over one sample.")
print()
print("| K | per-loader RssAnon MiB | per-loader RssFile MiB | per-loader RssShmem MiB "
      "| total RssAnon MiB | total RssAnon / dataset | total Pss MiB | total Pss / dataset |")
print("|---|---|---|---|---|---|---|---|")
for k, peak, total_anon, total_pss, samples in rows:
    def each(key):
        return ", ".join(f"{m[key] / 1024:.1f}" for _, m in sorted(peak.items()))
    print(f"| {k} | {each('RssAnon')} | {each('RssFile')} | {each('RssShmem')} "
          f"| {total_anon / 1024:.1f} | {total_anon * 1024 / dataset_bytes:.2f} "
          f"| {total_pss / 1024:.1f} | {total_pss * 1024 / dataset_bytes:.2f} |")
PY
smoke_check "$log" job:samples\>0 job:steps_at_end\>0 job:total_pss_kb\>0 loader:rss_anon_kb\>0
