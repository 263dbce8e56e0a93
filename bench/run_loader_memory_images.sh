#!/usr/bin/env bash
# Loader memory on a shard set several times larger than a memory cgroup (the scaled-up form of
# tests/memory_cgroup_test.cc): makes DATASET_MIB of WebDataset JPEG shards (DISTINCT synthetic
# photo-like JPEGs from bench/images/make_jpegs.py, hard-linked many times under other names and
# packed by stoker-dataset), starts a local stoker-server and one stoker-worker, puts the worker
# (and so the trainer and loaders it forks) in a cgroup v1 memory cgroup of CGROUP_MIB nested
# under this script's own, and trains one epoch with loader.processes K = 1, 2, 4. Before each
# job the shards are dropped from the page cache (POSIX_FADV_DONTNEED) and the cgroup's peak and
# failure counters are reset, so every job reads the whole dataset through the cgroup. While a
# job runs, each loader's and the trainer's /proc/PID/status (RssAnon, RssFile, VmHWM) and the
# cgroup's usage are sampled every 100 ms. Prints one row per K: the largest RssAnon of each
# loader, the largest sum over the loaders, each loader's VmHWM (peak resident, anonymous + file +
# shared), the trainer's largest RssAnon, the cgroup's max usage, pages charged to it (pgpgin),
# OOM kills, and samples/s.
#
# Usage: bench/run_loader_memory_images.sh [BIN_DIR]
#   Builds nothing. BIN_DIR holds stoker-server, stoker-worker, stoker-trainer, stoker-loader,
#   stoker and stoker-dataset; default: the build/ tree. Needs root (cgroup v1 memory controller)
#   and /usr/bin/python3 with numpy and Pillow.
#   Environment:
#     DATASET_MIB  size of the training shards (default 3584)
#     CGROUP_MIB   the cgroup's memory.limit_in_bytes (default 512)
#     LOADERS      loader counts (default "1 2 4")
#     DISTINCT     distinct JPEGs (default 400); IMAGE_SIZE: sample side (default 32)
#     WORK         work directory (default /tmp/stoker-loader-memory-images); removed at the end
#                  unless KEEP_DATA=1, which also reuses shards of the same parameters there
#     SMOKE=1      8 MiB of shards from 20 JPEGs, a 256 MiB cgroup, K = 1; exits 77 (skipped)
#                  where there is no writable cgroup v1 memory controller
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
source "$here/lib.sh"
NEED_DATASET_TOOL=1 find_programs "${1:-}"
dataset_mib=${DATASET_MIB:-3584}
cgroup_mib=${CGROUP_MIB:-512}
loaders=${LOADERS:-"1 2 4"}
distinct=${DISTINCT:-400}
if [[ "$smoke" == 1 ]]; then
  dataset_mib=8 cgroup_mib=256 loaders=1 distinct=20
  export WORK="${WORK:-/tmp/stoker-loader-memory-images-smoke-$$}"
fi
skip_or_fail() {  # MESSAGE: smoke mode skips (77) a machine without the cgroup it needs
  echo "$1" >&2
  [[ "$smoke" == 1 ]] && exit 77
  exit 1
}
image_size=${IMAGE_SIZE:-32}
work=${WORK:-/tmp/stoker-loader-memory-images}

# The cgroup: nested under this script's own memory cgroup, never a top-level one.
own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
[[ -n "$own" && "$own" != / ]] ||
  skip_or_fail "no (non-root) cgroup v1 memory cgroup for this process: '$own'"
[[ -w "/sys/fs/cgroup/memory$own" ]] ||
  skip_or_fail "/sys/fs/cgroup/memory$own is not writable (needs root and cgroup v1)"
cgroup="/sys/fs/cgroup/memory$own/stoker-bench-$$"

# The data: made once per parameter set when KEEP_DATA=1.
stamp="dataset_mib=$dataset_mib distinct=$distinct v1"
data="$work/data"
if [[ "${KEEP_DATA:-0}" != 1 || "$(cat "$work/stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$work"
  mkdir -p "$data"
  start=$(date +%s)
  /usr/bin/python3 "$here/images/make_jpegs.py" "$work/jpegs" --count "$distinct" --seed 7
  # An image folder of hard links: each JPEG under as many names as DATASET_MIB needs.
  /usr/bin/python3 - "$work/jpegs" "$work/folder" "$dataset_mib" <<'PY'
import os
import sys

jpegs, folder, dataset_mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = [os.path.join(d, f) for d, _, names in os.walk(jpegs) for f in names]
copies = -(-dataset_mib * 1048576 // sum(os.path.getsize(f) for f in files))
for f in files:
    target = os.path.join(folder, os.path.basename(os.path.dirname(f)))
    os.makedirs(target, exist_ok=True)
    for c in range(copies):
        os.link(f, os.path.join(target, f"c{c:04d}_{os.path.basename(f)}"))
print(f"{len(files)} JPEGs x {copies} names")
PY
  "$dataset_bin" pack --root "$work/folder" --out "$data/shards/train" --samples-per-shard 2000 |
    tail -1 >"$work/train-pattern"
  "$dataset_bin" pack --root "$work/jpegs" --out "$data/shards/test" --samples-per-shard 100000 |
    tail -1 >/dev/null
  rm -rf "$work/folder"
  echo "$stamp" >"$work/stamp"
  echo "data: $(du -sh "$data/shards" | cut -f1) of shards in $(($(date +%s) - start)) s"
fi
train_pattern=$(sed "s|$data/||" "$work/train-pattern")

state="$(mktemp -d "$work/run-XXXXXX")"
pids=()
cleanup() {
  stop_pids
  if [[ -d "$cgroup" ]]; then
    for _ in $(seq 100); do rmdir "$cgroup" 2>/dev/null && break; sleep 0.1; done
    [[ -d "$cgroup" ]] && echo "could not remove $cgroup: $(cat "$cgroup/cgroup.procs")" >&2
  fi
  if [[ "${KEEP_DATA:-0}" == 1 ]]; then rm -rf "$state"; else rm -rf "$work"; fi
}
trap cleanup EXIT INT TERM

mkdir "$cgroup"
echo $((cgroup_mib * 1048576)) >"$cgroup/memory.limit_in_bytes"

start_local_cluster "$data" bench-memory-images
echo "$worker_pid" >"$cgroup/cgroup.procs"  # before it can fork: its children start inside

echo "binaries: $(dirname "$loader_bin") (stoker-loader $(stat -c %y "$loader_bin" | cut -d. -f1))"
print_machine
print_load before

PYTHONPATH="$here" /usr/bin/python3 - "$cli" "$server" "$state" "$data" "$train_pattern" \
  "$cgroup" "$loaders" "$cgroup_mib" "$image_size" <<'PY' | tee "$state/log"
import glob
import json
import os
import sys
import time

from benchlib import job_pids, proc_kb, stoker_cli, write_job_file

cli, server, state, data, train_pattern, cgroup, loaders, cgroup_mib, size = sys.argv[1:10]
loader_counts = [int(k) for k in loaders.split()]
MIB = 1024.0 * 1024.0
BATCH = 64
work_dir = os.path.join(state, "worker")
shards = sorted(glob.glob(os.path.join(data, "shards", "train-*.tar")))
dataset_bytes = sum(os.path.getsize(s) for s in shards)
cgroup_relative = cgroup[len("/sys/fs/cgroup/memory"):]  # as /proc/PID/cgroup names it


stoker = stoker_cli(cli, server)


def cgroup_read(name):
    with open(os.path.join(cgroup, name)) as f:
        return f.read()


def cgroup_values(name):
    values = {}
    for line in cgroup_read(name).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def cgroup_write(name, value):
    with open(os.path.join(cgroup, name), "w") as f:
        f.write(str(value))


def drop_page_cache():
    for path in shards:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def job_file(k):
    return write_job_file(os.path.join(state, f"job-{k}.yaml"), f"""name: loader-memory-images-k{k}
dataset:
  format: shards
  train_images: "{train_pattern}"
  test_images: "shards/test-000000.tar"
  test_limit: 200
  classes: 10
  max_bad_samples: 0
  image: {{channels: 3, size: {size}, random_resized_crop: {{}}, horizontal_flip: true}}
model: {{type: mlp, hidden: [64]}}
train: {{epochs: 1, batch_size: {BATCH}, precision: fp32, seed: 1,
         optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}}}
loader: {{processes: {k}, ring_slots: 8}}
resources: {{gpus: 0}}
max_retries: 0
""")


def memory(pid):
    """kB of RssAnon, RssFile and VmHWM, and whether pid is in the cgroup; None once it is
    gone."""
    try:
        values = proc_kb(pid, "status", ("RssAnon", "RssFile", "VmHWM"))
        with open(f"/proc/{pid}/cgroup") as f:
            values["in_cgroup"] = any(line.split(":", 2)[1:] == ["memory", cgroup_relative]
                                      for line in f.read().splitlines())
    except OSError:
        return None
    return values if len(values) == 4 else None


def throughput(job_id):
    """Samples/s between the first and the last progress event, and the mean data stall."""
    points, stalls = [], []
    for line in stoker("logs", job_id, parse=False).splitlines():
        event = json.loads(line)
        progress = event.get("progress")
        if event.get("type") != "EVENT_TYPE_PROGRESS" or not progress:
            continue
        t = int(event.get("timeUnixMs", event.get("time_unix_ms", 0))) / 1000.0
        points.append((t, int(progress.get("step", 0))))
        stalls.append(float(progress.get("dataStallRatio", progress.get("data_stall_ratio", 0))))
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return float("nan"), float("nan")
    rate = (points[-1][1] - points[0][1]) * BATCH / (points[-1][0] - points[0][0])
    return rate, sum(stalls) / len(stalls)


rows = []
for k in loader_counts:
    drop_page_cache()
    cgroup_write("memory.max_usage_in_bytes", 0)
    cgroup_write("memory.failcnt", 0)
    pgpgin_before = cgroup_values("memory.stat").get("pgpgin", 0)
    oom_before = cgroup_values("memory.oom_control").get("oom_kill", 0)
    start = time.time()
    job_id = stoker("submit", job_file(k))["job"]["id"]
    peak = {}
    trainer_anon = 0
    total_anon = 0
    max_usage_seen = 0
    last_poll = 0.0
    while True:
        now = time.time()
        if now - last_poll >= 1.0:
            last_poll = now
            status = stoker("status", job_id)
            if status.get("state") in ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                                       "JOB_STATE_SUCCEEDED"):
                break
            if now - start > 3600:
                stoker("cancel", job_id)
                sys.exit(f"job {job_id}: not done after an hour")
        anon_sum = 0
        for pid in job_pids(work_dir, job_id, b"stoker-trainer"):
            m = memory(pid)
            trainer_anon = max(trainer_anon, m["RssAnon"] if m else 0)
        for pid in job_pids(work_dir, job_id):
            m = memory(pid)
            if m is None:
                continue
            p = peak.setdefault(pid, {"RssAnon": 0, "RssFile": 0, "VmHWM": 0, "in_cgroup": True,
                                      "n": 0})
            for key in ("RssAnon", "RssFile", "VmHWM"):
                p[key] = max(p[key], m[key])
            p["in_cgroup"] = p["in_cgroup"] and m["in_cgroup"]
            p["n"] += 1
            anon_sum += m["RssAnon"]
        total_anon = max(total_anon, anon_sum)
        max_usage_seen = max(max_usage_seen, int(cgroup_read("memory.usage_in_bytes")))
        time.sleep(0.02)
    wall = time.time() - start
    max_usage = int(cgroup_read("memory.max_usage_in_bytes"))
    failcnt = int(cgroup_read("memory.failcnt"))
    pgpgin = cgroup_values("memory.stat").get("pgpgin", 0) - pgpgin_before
    oom = cgroup_values("memory.oom_control")
    oom_kills = oom.get("oom_kill", 0) - oom_before
    rate, stall = throughput(job_id)
    state_name = status.get("state", "?").replace("JOB_STATE_", "")
    for pid, m in sorted(peak.items()):
        print(f"loader job={job_id} k={k} pid={pid} rss_anon_kb={m['RssAnon']} "
              f"rss_file_kb={m['RssFile']} vm_hwm_kb={m['VmHWM']} in_cgroup={m['in_cgroup']} "
              f"samples={m['n']}")
    print(f"job job={job_id} k={k} state={state_name} wall_s={wall:.1f} "
          f"total_rss_anon_kb={total_anon} trainer_rss_anon_kb={trainer_anon} "
          f"cgroup_max_usage_bytes={max_usage} failcnt={failcnt} "
          f"pgpgin_pages={pgpgin} oom_kill={oom_kills} under_oom={oom.get('under_oom')} "
          f"samples_per_s={rate:.0f} stall={stall:.2f} error={status.get('error', '')!r}",
          flush=True)
    rows.append((k, state_name, peak, total_anon, trainer_anon, max_usage, pgpgin, failcnt,
                 oom_kills, rate, stall, wall))

print()
print(f"{len(shards)} training shards, {dataset_bytes / MIB:.0f} MiB "
      f"({dataset_bytes / (int(cgroup_mib) * MIB):.1f}x the cgroup's {cgroup_mib} MiB limit); "
      f"one epoch, batch {BATCH}, {size}x{size} random_resized_crop + flip, MLP [64]. Per loader: "
      "the largest RssAnon seen (every 0.02 s); total: the largest sum over one sample.")
print()
print("| K | job | per-loader max RssAnon MiB | total RssAnon MiB | per-loader max RssFile MiB "
      "| per-loader VmHWM MiB | trainer max RssAnon MiB | cgroup max usage MiB "
      "| charged to cgroup (pgpgin) MiB | failcnt | OOM kills | samples/s | data stall | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for (k, state_name, peak, total_anon, trainer_anon, max_usage, pgpgin, failcnt, oom_kills, rate,
     stall, wall) in rows:
    def each(key):
        return ", ".join(f"{m[key] / 1024:.1f}" for _, m in sorted(peak.items()))
    print(f"| {k} | {state_name} | {each('RssAnon')} | {total_anon / 1024:.1f} | {each('RssFile')} "
          f"| {each('VmHWM')} | {trainer_anon / 1024:.1f} | {max_usage / MIB:.1f} | {pgpgin * 4096 / MIB:.0f} | {failcnt} | {oom_kills} "
          f"| {rate:.0f} | {stall:.2f} | {wall:.0f} |")
PY
# (A smoke job ends within a second or two: too soon for two progress events, so no samples/s.)
smoke_check "$state/log" job:state=SUCCEEDED job:oom_kill=0 job:pgpgin_pages\>0 \
  loader:rss_anon_kb\>0 loader:in_cgroup=True
