#!/usr/bin/env python3
"""The PyTorch peer of image_transform_bench: PIL decode + torchvision RandomResizedCrop(224) +
RandomHorizontalFlip + PILToTensor, one process, one thread, the files read into memory first.

Usage: /usr/bin/python3 bench/images/transform_pytorch.py DIR [--rounds 3] [--size 224]
       [--center-crop]

This is what a torchvision ImageFolder worker does per sample (its loader opens the file and
calls convert("RGB")), minus the file reads. Prints key=value lines like the C++ bench.
"""
import argparse
import io
import os
import sys
import time

import torch
import torchvision
import PIL
from PIL import Image
import torchvision.transforms as T


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--center-crop", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = sorted(os.path.join(root, f) for root, _, files in os.walk(args.dir) for f in files
                   if f.lower().endswith((".jpg", ".jpeg", ".png")))
    blobs = []
    for p in paths:
        with open(p, "rb") as f:
            blobs.append(f.read())
    if not blobs:
        print(f"transform_pytorch: no images under {args.dir}", file=sys.stderr)
        return 1
    if args.center_crop:
        transform = T.Compose([T.Resize(args.size * 8 // 7), T.CenterCrop(args.size),
                               T.PILToTensor()])
    else:
        transform = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(),
                               T.PILToTensor()])
    torch.manual_seed(0)

    def one_pass():
        checksum = 0
        for b in blobs:
            img = Image.open(io.BytesIO(b)).convert("RGB")
            out = transform(img)
            checksum += int(out[1, 0, 0])
        return checksum

    one_pass()  # warm-up
    # Wall-clock rate, and the rate per CPU-second of this thread (what one core does when a
    # shared machine does not take it away).
    rates, cpu_rates = [], []
    for r in range(args.rounds):
        start, cpu_start = time.perf_counter(), time.thread_time()
        one_pass()
        rates.append(len(blobs) / (time.perf_counter() - start))
        cpu_rates.append(len(blobs) / (time.thread_time() - cpu_start))
        print(f"round={r} images_per_s={rates[-1]:.1f} images_per_cpu_s={cpu_rates[-1]:.1f}")
    rates.sort()
    cpu_rates.sort()
    mean_kib = sum(len(b) for b in blobs) / len(blobs) / 1024
    print(f"images={len(blobs)} mean_file_kib={mean_kib:.1f} torch={torch.__version__} "
          f"torchvision={torchvision.__version__} pillow={PIL.__version__} threads=1")
    print(f"best_images_per_s={rates[-1]:.1f} median_images_per_s={rates[len(rates) // 2]:.1f} "
          f"best_images_per_cpu_s={cpu_rates[-1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
