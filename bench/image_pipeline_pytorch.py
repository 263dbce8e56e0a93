#!/usr/bin/python3
"""PyTorch DataLoader on an image folder: the peer of image_pipeline_bench's throughput part.

torchvision's ImageFolder (PIL loader: Image.open + convert("RGB")) with RandomResizedCrop(224),
RandomHorizontalFlip() and PILToTensor() (uint8 [3, 224, 224], as Stoker's samples), the default
collate, batches of 256, shuffle, num_workers 1 and 2, persistent workers, torch.set_num_threads(1)
in every worker. Every file is read once before timing (a warm page cache, as for Stoker). Time
runs from the first batch to the last over --epochs epochs and counts the images after the first
batch (worker start-up apart), as image_pipeline_bench measures Stoker; the workers' CPU seconds
over the same window come from /proc/PID/stat.

--profile N: one process, the first N images of the folder, the time of each stage as torchvision
runs it: read the bytes, decode (PIL open + convert("RGB") on the bytes: a full-size decode),
RandomResizedCrop (crop + bilinear resize), flip, PILToTensor.

Prints key=value lines (bench/run_image_pipeline.sh reads them).
Run with /usr/bin/python3 (Debian's python3-torch) and OPENBLAS_NUM_THREADS=1.
"""
import argparse
import io
import os
import time

import PIL
import torch
import torchvision
from PIL import Image, features
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a live process (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S


def one_thread(_worker_id):
    torch.set_num_threads(1)


def train_transform(size):
    return transforms.Compose([transforms.RandomResizedCrop(size),
                               transforms.RandomHorizontalFlip(), transforms.PILToTensor()])


def warm(paths):
    total = 0
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            total += len(f.read())
    print(f"warm bytes={total} seconds={time.perf_counter() - start:.3f}", flush=True)


def throughput(args, dataset, workers, run):
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=workers,
                        persistent_workers=True, worker_init_fn=one_thread)
    start = time.perf_counter()
    first = None
    images_after_first = 0
    images = 0
    checksum = 0
    iterator = None
    cpu_at_first = 0.0
    for _ in range(args.epochs):
        iterator = iter(loader)  # persistent: the same worker processes every epoch
        for x, y in iterator:
            if first is None:
                first = time.perf_counter()
                pids = [w.pid for w in iterator._workers]
                cpu_at_first = sum(cpu_seconds(pid) for pid in pids)
            else:
                images_after_first += len(y)
            images += len(y)
            checksum += int(x[0, 0, 0, 0]) + int(y[0])
    end = time.perf_counter()
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_at_first
    del iterator, loader
    expected = args.epochs * len(dataset)
    if images != expected:
        raise SystemExit(f"{images} images of {expected} arrived")
    seconds = end - first
    per_s = images_after_first / seconds
    print(f"throughput system=pytorch format=image_folder workers={workers} run={run} "
          f"batch={args.batch} epochs={args.epochs} images={images_after_first} "
          f"seconds={seconds:.3f} images_per_s={per_s:.1f} per_worker={per_s / workers:.1f} "
          f"cpu_s={cpu:.3f} images_per_cpu_s={images_after_first / cpu if cpu else 0:.1f} "
          f"startup_s={first - start:.3f} checksum={checksum}", flush=True)


def profile(args, dataset):
    count = min(args.profile, len(dataset))
    crop = transforms.RandomResizedCrop(args.size)
    flip = transforms.RandomHorizontalFlip()
    to_tensor = transforms.PILToTensor()
    totals = dict(read=0.0, decode=0.0, resize=0.0, flip=0.0, to_tensor=0.0)
    checksum = 0
    clock = time.thread_time
    for i in range(count):
        path = dataset.samples[i][0]
        t0 = clock()
        with open(path, "rb") as f:
            data = f.read()
        t1 = clock()
        img = Image.open(io.BytesIO(data)).convert("RGB")
        t2 = clock()
        img = crop(img)
        t3 = clock()
        img = flip(img)
        t4 = clock()
        x = to_tensor(img)
        t5 = clock()
        for key, seconds in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            totals[key] += seconds
        checksum += int(x[0, 0, 0])
    per_image = " ".join(f"{key}_us={1e6 * value / count:.1f}" for key, value in totals.items())
    total_us = 1e6 * sum(totals.values()) / count
    print(f"profile system=pytorch images={count} {per_image} total_us={total_us:.1f} "
          f"checksum={checksum}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the image folder (ROOT/CLASS/IMAGE)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="profile N images instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    dataset = datasets.ImageFolder(args.root, transform=train_transform(args.size))
    print(f"pytorch torch={torch.__version__} torchvision={torchvision.__version__} "
          f"pillow={PIL.__version__} libjpeg_turbo={features.check_feature('libjpeg_turbo')} "
          f"images={len(dataset)} classes={len(dataset.classes)}", flush=True)
    warm(path for path, _ in dataset.samples)
    if args.profile:
        profile(args, dataset)
        return
    for run in range(1, args.runs + 1):
        for workers in [int(w) for w in args.workers.split(",")]:
            throughput(args, dataset, workers, run)


if __name__ == "__main__":
    main()
