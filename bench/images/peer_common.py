"""What the image-pipeline peers share (bench/image_pipeline_pytorch.py and
bench/images/*_pipeline.py, run by bench/run_image_pipeline.sh under the peers' Python): the image
folder, the command line, the crop box, the clocks, and the one `throughput` line they all print,
in the format of image_pipeline_bench's (bench/pipeline/image_pipeline_bench.cc), so that the
script's tables read every side alike.

The measurement, for every peer: images/s from the first batch to the last over all epochs (the
images after the first batch; start-up apart), and images per CPU-second of all the processes of
the side over the same window: this process's own CPU time (getrusage RUSAGE_SELF, every thread:
the peers that work in threads are counted whole) plus each worker process's (/proc/PID/stat,
read at the first batch and again after the last, while the workers still live). Nothing else
runs in the window (no other children), so that is all of the side's CPU time.

Imports nothing beyond the standard library, so that a peer that is not installed can still say
so (`unavailable`).
"""
import argparse
import math
import os
import resource
import sys
import time

CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
EXTENSIONS = (".jpg", ".jpeg")


def parse_args(doc, default_configs, extra=None):
    """The peers' common command line; `extra(parser)` adds a peer's own options."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--root", required=True, help="the image folder (ROOT/CLASS/IMAGE)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", default="1,2",
                        help="worker processes or threads, comma-separated")
    parser.add_argument("--configs", default=default_configs,
                        help=f"configurations, comma-separated (default {default_configs})")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    if extra:
        extra(parser)
    args = parser.parse_args()
    args.worker_counts = [int(w) for w in args.workers.split(",") if w]
    args.config_names = [c for c in args.configs.split(",") if c]
    return args


def image_folder(root):
    """(paths, labels, classes) of ROOT/CLASS/IMAGE as torchvision's ImageFolder orders them:
    classes sorted, each class's files sorted, JPEGs only."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for file in sorted(os.listdir(folder)):
            if file.lower().endswith(EXTENSIONS):
                paths.append(os.path.join(folder, file))
                labels.append(label)
    if not paths:
        sys.exit(f"no JPEGs under {root}")
    return paths, labels, classes


def warm(paths):
    """Reads every file once (a warm page cache, as image_pipeline_bench does before timing)."""
    total = 0
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            total += len(f.read())
    print(f"warm bytes={total} seconds={time.perf_counter() - start:.3f}", flush=True)


def unavailable(system, error):
    """The line a peer prints when it is not installed (the table says so), and exits 0."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    print(f"unavailable system={system} reason={reason.replace(' ', '_')[:160]}", flush=True)
    print(f"{system}: not available ({reason})", file=sys.stderr)
    sys.exit(0)


def random_resized_crop_box(rng, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(left, top, w, h): torchvision's RandomResizedCrop box rule (an area fraction in `scale`
    and a log-uniform aspect ratio in `ratio`, ten tries, else the whole image clamped to the
    ratio range, centred), drawn from `rng` (random.Random)."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def self_cpu_seconds():
    """User + system CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid):
    """User + system CPU seconds of a live process, all its threads (/proc/PID/stat 14, 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S


class Meter:
    """Counts one run: call start() before the loader starts, batch(n) for each batch as it
    arrives (the first one opens the window), finish() after the last while the workers live,
    then report(). worker_pids() returns the side's worker processes (none for threads)."""

    def __init__(self, worker_pids=lambda: ()):
        self.worker_pids = worker_pids
        self.samples = 0
        self.images_after_first = 0
        self.checksum = 0

    def start(self):
        self.started = time.perf_counter()
        self.first = None

    def _cpu(self):
        pids = list(self.worker_pids())
        workers = sum(process_cpu_seconds(pid) for pid in pids)
        return self_cpu_seconds(), workers, len(pids)

    def batch(self, count, checksum=0):
        if self.first is None:
            self.first = time.perf_counter()
            self.cpu_at_first = self._cpu()
        else:
            self.images_after_first += count
        self.samples += count
        self.checksum += int(checksum)

    def finish(self):
        self.end = time.perf_counter()
        self.cpu_at_end = self._cpu()

    def report(self, system, config, workers, run, args, expected):
        """Prints the throughput line; exits 1 when the sample count is wrong."""
        if self.first is None:
            sys.exit(f"{system} {config}: no batch arrived")
        main_cpu = self.cpu_at_end[0] - self.cpu_at_first[0]
        worker_cpu = self.cpu_at_end[1] - self.cpu_at_first[1]
        cpu = main_cpu + worker_cpu
        seconds = self.end - self.first
        per_s = self.images_after_first / seconds if seconds > 0 else 0.0
        print(f"throughput system={system} config={config} format=image_folder workers={workers} "
              f"run={run} batch={args.batch} epochs={args.epochs} samples={self.samples} "
              f"images={self.images_after_first} seconds={seconds:.3f} images_per_s={per_s:.1f} "
              f"per_worker={per_s / workers:.1f} cpu_s={cpu:.3f} main_cpu_s={main_cpu:.3f} "
              f"worker_cpu_s={worker_cpu:.3f} worker_processes={self.cpu_at_end[2]} "
              f"images_per_cpu_s={self.images_after_first / cpu if cpu > 0 else 0:.1f} "
              f"startup_s={self.first - self.started:.3f} checksum={self.checksum}", flush=True)
        if self.samples != expected:
            sys.exit(f"{system} {config} workers={workers}: {self.samples} samples of "
                     f"{expected} arrived")
