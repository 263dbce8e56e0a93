"""torchvision + PyTorch's DataLoader on an image folder: a peer of image_pipeline_bench's
throughput part (bench/run_image_pipeline.sh runs it with the peers' Python, bench/peers/).

Two configurations, each with --workers worker processes (1 and 2):
  pil          torchvision's ImageFolder loader (PIL Image.open + convert("RGB"): a full-size
               decode), transforms.v2 RandomResizedCrop(224) + RandomHorizontalFlip() on the PIL
               image (PIL's bilinear resize: torchvision's pixels, what Stoker's exact decode
               gives), PILToTensor;
  decode_jpeg  torchvision.io.read_file + torchvision.io.decode_jpeg(mode=RGB) (a full-size
               decode to a uint8 tensor), v2 RandomResizedCrop(224) (antialiased bilinear on the
               tensor) + RandomHorizontalFlip().
Both give uint8 [3, 224, 224]; default collate, batches of 256, shuffle, persistent workers,
torch.set_num_threads(1) in the main process and in every worker. With a torchvision older than
0.15 (Debian's 0.14, PEER_PYTHON=/usr/bin/python3) the v1 transforms stand in for v2.

Every file is read once before timing (a warm page cache). Measured as image_pipeline_bench
measures Stoker (bench/images/peer_common.py): images/s from the first batch to the last over
--epochs epochs, and images per CPU-second of all the side's processes over the same window (the
main process by getrusage, the workers by /proc/PID/stat before they exit).

--profile N: one process, the first N images, the time of each stage of the pil configuration:
read the bytes, decode (PIL open + convert("RGB")), RandomResizedCrop, flip, PILToTensor.

Prints key=value lines (bench/run_image_pipeline.sh reads them).
"""
import io
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "images"))
import peer_common  # noqa: E402

try:
    import PIL
    import torch
    import torchvision
    from PIL import Image, features
    from torch.utils.data import DataLoader, Dataset
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
except ImportError as error:
    peer_common.unavailable("torchvision", error)

try:
    from torchvision.transforms import v2 as transforms
    TRANSFORMS = "v2"
except ImportError:  # torchvision < 0.15
    from torchvision import transforms
    TRANSFORMS = "v1"


def crop_and_flip(size, tensor_input):
    try:
        crop = transforms.RandomResizedCrop(size, antialias=True)
    except TypeError:  # a torchvision without the argument
        crop = transforms.RandomResizedCrop(size)
    steps = [crop, transforms.RandomHorizontalFlip()]
    if not tensor_input:
        steps.append(transforms.PILToTensor())
    return transforms.Compose(steps)


class PilFolder(Dataset):
    """ImageFolder's PIL path: open, convert("RGB"), the transforms on the PIL image."""

    def __init__(self, paths, labels, size):
        self.paths, self.labels = paths, labels
        self.transform = crop_and_flip(size, tensor_input=False)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            image = Image.open(f).convert("RGB")
        return self.transform(image), self.labels[i]


class DecodeJpegFolder(Dataset):
    """torchvision.io: read_file + decode_jpeg to a uint8 tensor, the transforms on it."""

    def __init__(self, paths, labels, size):
        self.paths, self.labels = paths, labels
        self.transform = crop_and_flip(size, tensor_input=True)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        image = decode_jpeg(read_file(self.paths[i]), mode=ImageReadMode.RGB)
        return self.transform(image), self.labels[i]


CONFIGS = {"pil": PilFolder, "decode_jpeg": DecodeJpegFolder}


def one_thread(_worker_id):
    torch.set_num_threads(1)


def throughput(args, dataset, config, workers, run):
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=workers,
                        persistent_workers=True, worker_init_fn=one_thread)
    pids = []
    meter = peer_common.Meter(lambda: pids)
    meter.start()
    for _ in range(args.epochs):
        iterator = iter(loader)  # persistent: the same worker processes every epoch
        pids[:] = [w.pid for w in iterator._workers]
        for x, y in iterator:
            meter.batch(len(y), int(x[0, 0, 0, 0]) + int(y[0]))
    meter.finish()  # the workers still live: their CPU time is read before they exit
    del iterator, loader
    meter.report("torchvision", config, workers, run, args, args.epochs * len(dataset))


def profile(args, paths):
    count = min(args.profile, len(paths))
    crop = transforms.RandomResizedCrop(args.size)
    flip = transforms.RandomHorizontalFlip()
    to_tensor = transforms.PILToTensor()
    totals = dict(read=0.0, decode=0.0, resize=0.0, flip=0.0, to_tensor=0.0)
    checksum = 0
    clock = time.thread_time
    for path in paths[:count]:
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
    print(f"profile system=torchvision config=pil images={count} {per_image} "
          f"total_us={total_us:.1f} checksum={checksum}", flush=True)


def main():
    args = peer_common.parse_args(__doc__, "pil,decode_jpeg", lambda p: p.add_argument(
        "--profile", type=int, default=0, help="profile N images instead"))
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    paths, labels, classes = peer_common.image_folder(args.root)
    print(f"torchvision torch={torch.__version__} torchvision={torchvision.__version__} "
          f"transforms={TRANSFORMS} pillow={PIL.__version__} "
          f"libjpeg_turbo={features.check_feature('libjpeg_turbo')} images={len(paths)} "
          f"classes={len(classes)}", flush=True)
    peer_common.warm(paths)
    if args.profile:
        profile(args, paths)
        return
    for config in args.config_names:
        if config not in CONFIGS:
            sys.exit(f"unknown configuration {config} ({', '.join(CONFIGS)})")
    for run in range(1, args.runs + 1):
        for config in args.config_names:
            dataset = CONFIGS[config](paths, labels, args.size)
            for workers in args.worker_counts:
                throughput(args, dataset, config, workers, run)


if __name__ == "__main__":
    main()
