#!/usr/bin/python3
"""PyTorch DataLoader on Fashion-MNIST: the peer of pipeline_bench's throughput part.

The dataset holds the uint8 images in memory (as Stoker's loaders do) and normalises each sample
to float32, (x/255 - mean)/std, in __getitem__; the default collate stacks a batch. Shuffled
batches of 256, num_workers 1 and 2, persistent workers. Time runs from the first batch to the
last (worker start-up is reported apart), as pipeline_bench measures Stoker.
Prints key=value lines (bench/run_pipeline.sh reads them).
Run with /usr/bin/python3 (Debian's python3-torch) and OPENBLAS_NUM_THREADS=1.
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


class FashionMnist(Dataset):
    def __init__(self, root):
        images = read_idx(os.path.join(root, "train-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(root, "train-labels-idx1-ubyte.gz"))
        self.images = torch.from_numpy(images.reshape(len(images), -1).copy())
        self.labels = torch.from_numpy(labels.astype(np.int64))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i].to(torch.float32).div_(255.0).sub_(MEAN).div_(STD)
        return x, self.labels[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    dataset = FashionMnist(args.data_dir)
    for workers in [int(w) for w in args.workers.split(",")]:
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=workers,
                            persistent_workers=True)
        start = time.perf_counter()
        first = None
        samples_after_first = 0
        checksum = 0.0
        for _ in range(args.epochs):
            for x, y in loader:
                if first is None:
                    first = time.perf_counter()
                else:
                    samples_after_first += len(y)
                checksum += float(x[0, 392]) + int(y[0])
        end = time.perf_counter()
        del loader
        print(f"throughput system=pytorch workers={workers} batch={args.batch} "
              f"epochs={args.epochs} samples={samples_after_first} seconds={end - first:.4f} "
              f"samples_per_s={samples_after_first / (end - first):.0f} "
              f"startup_s={first - start:.3f} checksum={checksum:.1f}", flush=True)


if __name__ == "__main__":
    main()
