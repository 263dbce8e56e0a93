"""SPDL (spdl.io + spdl.pipeline) on the CPU: a peer of image_pipeline_bench's throughput part
(bench/run_image_pipeline.sh runs it with the peers' Python, bench/peers/).

SPDL's documented CPU path: a spdl.pipeline.PipelineBuilder pipeline in this process, its thread
pool of --workers threads (1 and 2), the decode stage run with that concurrency:
  source   the folder's (path, label) pairs, every epoch shuffled, all epochs in one pass;
  decode   read the file, spdl.io.demux_image, then spdl.io.decode_packets with an FFmpeg filter
           graph "crop=W:H:X:Y,scale=224:224:flags=bilinear[,hflip],format=pix_fmts=rgb24":
           FFmpeg's JPEG decoder (the whole image), its crop (a view), swscale's bilinear
           resize to 224 x 224 (not torchvision's pixels), the flip; the box is
           RandomResizedCrop's rule (bench/images/peer_common.py) on the size the demuxer read;
  batch    aggregate --batch frames, spdl.io.convert_frames (one NHWC uint8 buffer), then
           HWC -> CHW (numpy) so that every side hands over uint8 [N, 3, 224, 224].
The configuration `threads` is that pipeline with the stage hooks off (no per-task statistics).

Every file is read once before timing (a warm page cache). Measured as image_pipeline_bench
measures Stoker (bench/images/peer_common.py): images/s from the first batch to the last, and
images per CPU-second of this process (every thread of the pipeline) over the same window.
"""
import random

import peer_common

try:
    import numpy as np
    import spdl.io
    import spdl.pipeline
    from spdl.pipeline import PipelineBuilder
    from importlib.metadata import version
except ImportError as error:
    peer_common.unavailable("spdl", error)


def decoder(size):
    def decode(item):
        path, label, seed = item
        rng = random.Random(seed)
        with open(path, "rb") as f:
            packets = spdl.io.demux_image(f.read())
        x, y, w, h = peer_common.random_resized_crop_box(rng, packets.width, packets.height)
        flip = ",hflip" if rng.random() < 0.5 else ""
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={w}:{h}:{x}:{y},scale={size}:{size}:flags=bilinear"
                                 f"{flip},format=pix_fmts=rgb24")
        return frames, label
    return decode


def collate(items):
    hwc = spdl.io.to_numpy(spdl.io.convert_frames([frames for frames, _ in items]))
    return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2)), np.array([l for _, l in items])


def source(paths, labels, epochs, seed):
    rng = random.Random(seed)
    order = list(range(len(paths)))
    for _ in range(epochs):
        rng.shuffle(order)
        for i in order:
            yield paths[i], labels[i], rng.getrandbits(64)


def throughput(args, paths, labels, config, threads, run):
    if config != "threads":
        raise SystemExit(f"unknown configuration {config} (threads)")
    meter = peer_common.Meter()
    meter.start()
    pipeline = (PipelineBuilder()
                .add_source(source(paths, labels, args.epochs, args.seed + run))
                .pipe(decoder(args.size), concurrency=threads)
                .aggregate(args.batch)
                .pipe(collate)
                .add_sink()
                .build(num_threads=threads, task_hook_factory=lambda _: []))
    with pipeline.auto_stop():
        for images, batch_labels in pipeline:
            if images.shape[1:] != (3, args.size, args.size) or images.dtype != np.uint8:
                raise SystemExit(f"SPDL gave {images.shape} {images.dtype}")
            meter.batch(len(images), int(images[0, 0, 0, 0]) + int(batch_labels[0]))
        meter.finish()
    meter.report("spdl", config, threads, run, args, args.epochs * len(paths))


def main():
    args = peer_common.parse_args(__doc__, "threads")
    paths, labels, classes = peer_common.image_folder(args.root)
    try:  # spdl.io loads the system's FFmpeg libraries on first use
        with open(paths[0], "rb") as f:
            spdl.io.demux_image(f.read())
    except (ImportError, RuntimeError) as error:
        peer_common.unavailable("spdl", error)
    print(f"spdl spdl={version('spdl')} images={len(paths)} classes={len(classes)}", flush=True)
    peer_common.warm(paths)
    for run in range(1, args.runs + 1):
        for config in args.config_names:
            for threads in args.worker_counts:
                throughput(args, paths, labels, config, threads, run)


if __name__ == "__main__":
    main()
