"""NVIDIA DALI on its CPU backend: a peer of image_pipeline_bench's throughput part
(bench/run_image_pipeline.sh runs it with the peers' Python, bench/peers/).

One DALI pipeline per run, every operator on the CPU (device_id=None, device="cpu"), --workers
DALI threads (num_threads 1 and 2; DALI's own reader and executor threads besides, all in this
process): fn.readers.file over the image folder (labels from the class folders, random_shuffle),
fn.decoders.image_random_crop (decodes only the random crop box: RandomResizedCrop's area
0.08-1 and aspect 3/4-4/3; libjpeg-turbo through nvImageCodec's CPU path), fn.resize to 224 x 224
(DALI's own antialiased linear resampling: not torchvision's pixels), then the flip and the
HWC -> CHW layout:
  cmn   fn.crop_mirror_normalize(dtype=UINT8, output_layout="CHW", mirror=fn.random.coin_flip()),
        flip and layout in one pass (what DALI's ResNet examples do);
  flip  fn.flip(horizontal=fn.random.coin_flip()) + fn.transpose(perm=[2, 0, 1]).
Both give uint8 [3, 224, 224] per sample, batches of --batch (the folder's size must be a
multiple of it: DALI's batches are always full). Each run calls the pipeline epochs x
(images / batch) times.

Every file is read once before timing (a warm page cache). Measured as image_pipeline_bench
measures Stoker (bench/images/peer_common.py): images/s from the first batch to the last, and
images per CPU-second of this process (all of DALI's threads) over the same window.
"""
import peer_common

try:
    import numpy as np
    import nvidia.dali
    from nvidia.dali import fn, pipeline_def, types
except ImportError as error:
    peer_common.unavailable("dali", error)


def build(args, config, threads):
    @pipeline_def(batch_size=args.batch, num_threads=threads, device_id=None, seed=args.seed)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=args.root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=args.size, resize_y=args.size)
        flip = fn.random.coin_flip()
        if config == "cmn":
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                              mirror=flip, mean=[0.0], std=[1.0])
        elif config == "flip":
            images = fn.transpose(fn.flip(images, horizontal=flip), perm=[2, 0, 1])
        else:
            raise SystemExit(f"unknown configuration {config} (cmn, flip)")
        return images, labels

    pipe = pipeline()
    pipe.build()
    return pipe


def throughput(args, count, config, threads, run):
    meter = peer_common.Meter()
    meter.start()
    pipe = build(args, config, threads)
    if pipe.epoch_size("Reader") != count:
        raise SystemExit(f"DALI's reader sees {pipe.epoch_size('Reader')} files, not {count}")
    for _ in range(args.epochs * count // args.batch):
        images, labels = pipe.run()
        first = np.asarray(images[0])
        if first.shape != (3, args.size, args.size) or first.dtype != np.uint8:
            raise SystemExit(f"DALI gave {first.shape} {first.dtype}")
        meter.batch(len(images), int(first[0, 0, 0]) + int(np.asarray(labels[0])[0]))
    meter.finish()
    del pipe
    meter.report("dali", config, threads, run, args, args.epochs * count)


def main():
    args = peer_common.parse_args(__doc__, "cmn")
    paths, _, classes = peer_common.image_folder(args.root)
    if len(paths) % args.batch:
        raise SystemExit(f"{len(paths)} images: not a multiple of the batch ({args.batch})")
    print(f"dali dali={nvidia.dali.__version__} images={len(paths)} classes={len(classes)}",
          flush=True)
    peer_common.warm(paths)
    for run in range(1, args.runs + 1):
        for config in args.config_names:
            for threads in args.worker_counts:
                throughput(args, len(paths), config, threads, run)


if __name__ == "__main__":
    main()
