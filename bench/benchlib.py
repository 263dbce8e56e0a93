"""Python helpers of the bench/run_*.sh scripts (on PYTHONPATH=bench/): their logs of key=value
lines; the stoker CLI, a job's processes and their memory on a local cluster (bench/lib.sh's
start_local_cluster)."""

import json
import os
import subprocess


def log_rows(path):
    """(kind, fields) for each line of `path`: its first word and a dict of its key=value words
    (other words and blank lines are skipped), as the benchmark programs and their PyTorch
    counterparts print them."""
    rows = []
    for line in open(path):
        if not line.split():
            continue  # a blank line
        kind, *pairs = line.split()
        rows.append((kind, dict(p.split("=", 1) for p in pairs if "=" in p)))
    return rows


def stoker_cli(cli, server):
    """A function that runs the stoker CLI `cli` against `server` with JSON output:
    stoker(*args) returns the parsed JSON, stoker(*args, parse=False) the text."""
    def stoker(*args, parse=True):
        out = subprocess.run([cli, "--server", server, "-o", "json", *args], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out) if parse else out
    return stoker


def write_job_file(path, text):
    """Writes the job file `text` to `path` and returns the path."""
    with open(path, "w") as f:
        f.write(text)
    return path


def job_pids(work_dir, job_id, program=b"stoker-loader"):
    """Pids of the running `program` processes of `job_id` (their command lines name a file in
    the attempt's directory <work_dir>/<job_id>-a<n>/), sorted."""
    found = []
    prefix = os.path.join(work_dir, job_id + "-a").encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(program) and any(a.startswith(prefix) for a in argv):
            found.append(int(entry))
    return sorted(found)


def proc_kb(pid, name, keys):
    """The values (kB) of `keys` in /proc/<pid>/<name> ("status", "smaps_rollup": lines
    "Key: value kB"), those found; OSError once the process is gone."""
    values = {}
    with open(f"/proc/{pid}/{name}") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in keys:
                values[key] = int(rest.split()[0])
    return values
