#!/usr/bin/env python3
"""Synthetic photo-like JPEGs for the image transform benchmarks (bench/images/).

Usage: /usr/bin/python3 bench/images/make_jpegs.py OUT_DIR [--count N] [--seed S] [--quality Q]

Writes N images (default 2000) in torchvision's ImageFolder layout, OUT_DIR/class_0 ..
OUT_DIR/class_9, each about 500 x 375 (sides varied by up to +-15 %, some portrait), JPEG quality
90 (4:2:0, PIL's default), deterministic from the seed. The content is what a photo's encoder
sees: smooth colour gradients, shapes with hard edges, a fine texture and sensor-like noise, so
that the files compress like photos (~100-150 KB at quality 90) rather than like flat art.
Prints the count and the mean file size. data/image/torchvision_reference.py imports image() to
test the fast decode mode on the first of these images.
"""
import argparse
import io
import os
import sys

import numpy as np
from PIL import Image


def photo(rng, height, width):
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p, q = rng.uniform(-1, 1, 4)
        img[..., c] = (120 + 50 * np.sin(a * x / 40 + b * y / 55 + 6 * p)
                       + 30 * np.cos((x * q - y) / 90) + 40 * (x / width - y / height))
    for _ in range(rng.integers(8, 16)):  # discs and boxes with hard edges
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        r = rng.uniform(10, min(height, width) / 3)
        if rng.random() < 0.5:
            mask = (y - cy) ** 2 + (x - cx) ** 2 < r * r
        else:
            mask = (np.abs(y - cy) < r) & (np.abs(x - cx) < r * rng.uniform(0.3, 1.5))
        img[mask] = 0.4 * img[mask] + 0.6 * colour
    # Fine texture (foliage, fabric) in part of the image, then noise everywhere.
    tex = rng.normal(0, 1, (height // 2 + 1, width // 2 + 1, 3)).astype(np.float32)
    tex = np.repeat(np.repeat(tex, 2, axis=0), 2, axis=1)[:height, :width]
    weight = (np.sin(x / 70 + rng.uniform(0, 6)) * np.sin(y / 50) > 0).astype(np.float32)
    img += tex * 36 * weight[..., None]
    img += rng.normal(0, 14, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def image(seed, i):
    """Image i of the set made with `seed`: (class label, HxWx3 uint8 array)."""
    rng = np.random.default_rng([seed, i])
    width = int(500 * rng.uniform(0.85, 1.15))
    height = int(375 * rng.uniform(0.85, 1.15))
    if rng.random() < 0.2:  # portrait
        width, height = height, width
    return i % 10, photo(rng, height, width)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quality", type=int, default=90)
    args = parser.parse_args()
    total = 0
    for i in range(args.count):
        label, pixels = image(args.seed, i)
        directory = os.path.join(args.out_dir, f"class_{label}")
        os.makedirs(directory, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=args.quality)
        with open(os.path.join(directory, f"img_{i:05d}.jpg"), "wb") as f:
            f.write(buffer.getvalue())
        total += buffer.tell()
    print(f"make_jpegs: {args.count} images in {args.out_dir}, mean {total / args.count / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
