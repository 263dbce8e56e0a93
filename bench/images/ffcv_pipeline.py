"""FFCV in JPEG mode: a peer of image_pipeline_bench's throughput part (bench/run_image_pipeline.sh
runs it with the peers' Python, bench/peers/).

FFCV reads its own file format, so the image folder is first written into a .beton (--beton,
made once and kept; its time is printed as a `pack` line): each image stored as the original
JPEG file's bytes, unchanged (an RGBImageField in 'jpg' mode whose encoder is given the file's
bytes instead of re-encoding decoded pixels, so every side decodes the same JPEGs), and its label.
Then ffcv.loader.Loader with --workers threads (num_workers 1 and 2: FFCV's numba-compiled
pipeline runs in this process's threads), order RANDOM, os_cache (the file memory-mapped),
batches of --batch, pipelines:
  image  RandomResizedCropRGBImageDecoder((224, 224)) (libjpeg-turbo decodes the whole image,
         then OpenCV resizes the box: not torchvision's pixels), RandomHorizontalFlip(),
         ToTensor(), ToTorchImage(channels_last=False) (a contiguous uint8 [N, 3, 224, 224], as
         every side hands over; torch's threads set to the same count);
  label  IntDecoder(), ToTensor().
The configuration is named `jpeg` (JPEG mode, not raw pixels).

Every page of the .beton is read once before timing (a warm page cache). Measured as
image_pipeline_bench measures Stoker (bench/images/peer_common.py): images/s from the first batch
to the last, and images per CPU-second of this process (every thread) over the same window. The
first batch of each run includes numba's compilation (start-up, outside the window).
"""
import os
import time

import peer_common

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bar from FFCV's writer

try:
    import numpy as np
    import torch
    from importlib.metadata import version
    from PIL import Image
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.fields.rgb_image import IMAGE_MODES
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
except ImportError as error:
    peer_common.unavailable("ffcv", error)


LOADERS = []


class OriginalJpegs:
    """The folder as FFCV's writer indexes it: (the file's bytes, width, height), label."""

    def __init__(self, paths, labels):
        self.paths, self.labels = paths, labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        with Image.open(self.paths[i]) as image:  # the header only
            width, height = image.size
        return (data, width, height), self.labels[i]


def store_original_jpeg(destination, sample, malloc):
    """RGBImageField's encoder contract, in 'jpg' mode, with the file's own bytes."""
    data, width, height = sample
    destination["mode"] = IMAGE_MODES["jpg"]
    destination["width"], destination["height"] = width, height
    destination["data_ptr"], storage = malloc(len(data))
    storage[:] = np.frombuffer(data, np.uint8)


def write_beton(path, paths, labels):
    image = RGBImageField(write_mode="jpg")
    image.encode = store_original_jpeg  # the writer's processes are forked: they keep it
    start = time.perf_counter()
    tmp = path + ".tmp"
    DatasetWriter(tmp, {"image": image, "label": IntField()}, num_workers=1).from_indexed_dataset(
        OriginalJpegs(paths, labels))
    os.replace(tmp, path)
    print(f"pack system=ffcv samples={len(paths)} bytes={os.path.getsize(path)} "
          f"seconds={time.perf_counter() - start:.3f}", flush=True)


def throughput(args, count, config, threads, run):
    if config != "jpeg":
        raise SystemExit(f"unknown configuration {config} (jpeg)")
    torch.set_num_threads(threads)
    meter = peer_common.Meter()
    meter.start()
    loader = Loader(args.beton, batch_size=args.batch, num_workers=threads,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False,
                    seed=args.seed + run, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((args.size, args.size)),
                                  RandomHorizontalFlip(), ToTensor(),
                                  ToTorchImage(channels_last=False)],
                        "label": [IntDecoder(), ToTensor()]})
    for _ in range(args.epochs):
        for images, labels in loader:
            if images.shape[1:] != (3, args.size, args.size) or images.dtype != torch.uint8 \
                    or not images.is_contiguous():
                raise SystemExit(f"FFCV gave {tuple(images.shape)} {images.dtype}")
            meter.batch(len(images), int(images[0, 0, 0, 0]) + int(labels[0]))
    meter.finish()
    # Kept alive to the end: numba's finalizers fail noisily (a KeyError, ignored) when a
    # Loader is collected before the process exits.
    LOADERS.append(loader)
    meter.report("ffcv", config, threads, run, args, args.epochs * count)


def main():
    args = peer_common.parse_args(__doc__, "jpeg", lambda p: p.add_argument(
        "--beton", required=True, help="the FFCV file (written from --root when missing)"))
    paths, labels, classes = peer_common.image_folder(args.root)
    print(f"ffcv ffcv={version('ffcv')} numba={version('numba')} images={len(paths)} "
          f"classes={len(classes)}", flush=True)
    if not os.path.exists(args.beton):
        write_beton(args.beton, paths, labels)
    peer_common.warm([args.beton])
    for run in range(1, args.runs + 1):
        for config in args.config_names:
            for threads in args.worker_counts:
                throughput(args, len(paths), config, threads, run)


if __name__ == "__main__":
    main()
