"""Runs image_pipeline_bench --parts=throughput (one --loaders count) and adds its own process's
CPU time to its throughput line: bench/run_image_pipeline.sh's count of all of Stoker's
processes. Runs under /usr/bin/python3 (the standard library only).

Usage: consumer_cpu.py BENCH ARGS...

image_pipeline_bench's cpu_s is the loader processes' CPU time over the window from the first
batch to the last (/proc/PID/stat at the first batch, wait4 at the end); its own process, the
consumer that takes and releases the batches, is not in it. This waits for the bench to exit
without reaping it (waitid WNOWAIT), reads the exited process's own user + system time from
/proc/PID/stat (fields 14 and 15: all its threads, not its children), and appends
consumer_cpu_s=<that> to the throughput line, which it holds back until then. That is the
consumer's CPU time over the bench's whole life (flag parsing, the index read, the page cache
warmed by reading every file once, the ring made, the window, the loaders reaped): an upper bound
on its share of the window, so Stoker's per-CPU-second figure computed from it is a lower bound.
A line that already has consumer_cpu_s (a bench that counts itself) is passed through as it is.
Exits with the bench's status; more than one throughput line is an error (pass one --loaders).
"""
import os
import subprocess
import sys

CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1])
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
    held = []
    for line in child.stdout:
        if line.startswith("throughput ") and "consumer_cpu_s=" not in line:
            held.append(line.rstrip("\n"))
        else:
            sys.stdout.write(line)
            sys.stdout.flush()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    with open(f"/proc/{child.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own_cpu = (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S
    status = child.wait()
    if len(held) > 1:
        sys.exit(f"consumer_cpu.py: {len(held)} throughput lines from one bench run: pass one "
                 "--loaders count")
    for line in held:
        print(f"{line} consumer_cpu_s={own_cpu:.3f}", flush=True)
    sys.exit(status if status >= 0 else 128 - status)


if __name__ == "__main__":
    main()
