#!/usr/bin/env python3
"""Reference data for data/image/image_test.cc, made with PIL and torchvision.

Usage: /usr/bin/python3 data/image/torchvision_reference.py OUT_DIR

Writes into OUT_DIR the test images (PNG in every layout PIL reads: 1/2/4/8/16-bit gray, gray
with alpha or tRNS, RGB, RGBA, palettes with transparency, Adam7 interlacing; JPEG baseline 4:2:0
and 4:4:4, gray, progressive, CMYK), what PIL decodes from each (convert("RGB") and convert("L")),
what torchvision's resized_crop (+ hflip) and Resize + CenterCrop make of a few images, and
statistics of RandomResizedCrop.get_params. OUT_DIR/manifest.txt lists the cases, one a line:

  codec FILE STORED_CHANNELS WIDTH HEIGHT            (expected FILE.rgb, FILE.l: HWC bytes)
  crop FILE CHANNELS TOP LEFT HEIGHT WIDTH SIZE FLIP EXPECTED   (CHW bytes)
  center FILE CHANNELS RESIZE SIZE EXPECTED                      (CHW bytes)
  bench FILE CHANNELS TOP LEFT HEIGHT WIDTH SIZE FLIP EXPECTED   (the image benchmark's JPEGs)
  benchcenter FILE CHANNELS RESIZE SIZE EXPECTED
  rrc HEIGHT WIDTH SCALE_MIN SCALE_MAX RATIO_MIN RATIO_MAX DRAWS MEAN_AREA_FRACTION
      SD_AREA_FRACTION MEAN_LOG_ASPECT SD_LOG_ASPECT FALLBACK_RATE   (one line)

Exits 3 when PIL or torchvision is missing (the test then skips with that message).
"""
import importlib.util
import math
import os
import struct
import sys
import warnings
import zlib

try:
    import numpy as np
    import torch
    from PIL import Image
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
except ImportError as e:  # the test skips with this message
    print(f"torchvision_reference.py: {e}", file=sys.stderr)
    sys.exit(3)


def photo(height, width, seed, channels=3):
    """A photo-like image: smooth gradients, a few shapes, mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.zeros((height, width, 3))
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * x / 23 + b * y / 31 + p * 6) + 40 * (x / width - y / height)
    for _ in range(6):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        r = rng.uniform(5, max(6, min(height, width) / 3))
        mask = (y - cy) ** 2 + (x - cx) ** 2 < r * r
        img[mask] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img if channels == 3 else img[..., 0]


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pack_row(row, depth):
    """row: 1-D array of samples at `depth` bits."""
    if depth == 16:
        return row.astype(">u2").tobytes()
    if depth == 8:
        return row.astype(np.uint8).tobytes()
    per = 8 // depth
    out = bytearray((len(row) + per - 1) // per)
    for i, v in enumerate(row):
        out[i // per] |= int(v) << (8 - depth * (i % per + 1))
    return bytes(out)


def write_png(path, samples, color_type, depth, interlace=False, palette=None, trns=None):
    """A PNG written by hand (PIL cannot write 16-bit colour, 2/4-bit gray or Adam7)."""
    h, w = samples.shape[:2]
    flat = samples.reshape(h, w, -1)
    chunks = [png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0,
                                             1 if interlace else 0))]
    if palette is not None:
        chunks.append(png_chunk(b"PLTE", bytes(palette)))
    if trns is not None:
        chunks.append(png_chunk(b"tRNS", trns))
    passes = ([(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
               (0, 1, 1, 2)] if interlace else [(0, 0, 1, 1)])
    raw = bytearray()
    for x0, y0, dx, dy in passes:
        sub = flat[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in sub:
            raw += b"\x00" + pack_row(row.reshape(-1), depth)
    chunks.append(png_chunk(b"IDAT", zlib.compress(bytes(raw))))
    chunks.append(png_chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + b"".join(chunks))


def codec_cases(out, lines):
    rng = np.random.default_rng(7)
    rgb = photo(37, 53, 1)
    files = []

    def pil_save(name, img, **kw):
        img.save(os.path.join(out, name), **kw)
        files.append(name)

    pil_save("rgb8.png", Image.fromarray(rgb))
    pil_save("gray8.png", Image.fromarray(rgb[..., 1]))
    rgba = np.dstack([rgb, rng.integers(0, 256, rgb.shape[:2], dtype=np.uint8)])
    pil_save("rgba8.png", Image.fromarray(rgba, "RGBA"))
    pil_save("la8.png", Image.fromarray(rgba[..., 1:3].copy(), "LA"))
    pal = Image.fromarray(rgb).quantize(colors=40)
    pal.info["transparency"] = 3
    pil_save("pal8.png", pal, transparency=3)
    pil_save("gray1.png", Image.fromarray(rgb[..., 0] > 128))

    def manual(name, samples, color_type, depth, **kw):
        write_png(os.path.join(out, name), samples, color_type, depth, **kw)
        files.append(name)

    h, w = 29, 43
    manual("gray2.png", rng.integers(0, 4, (h, w)), 0, 2)
    manual("gray4.png", rng.integers(0, 16, (h, w)), 0, 4)
    # 16-bit gray: small values too, to see PIL's clipping of mode "I".
    g16 = rng.integers(0, 65536, (h, w))
    g16[: h // 2] = rng.integers(0, 300, (h // 2, w))
    manual("gray16.png", g16, 0, 16)
    manual("rgb16.png", rng.integers(0, 65536, (h, w, 3)), 2, 16)
    manual("la16.png", rng.integers(0, 65536, (h, w, 2)), 4, 16)
    manual("rgba16.png", rng.integers(0, 65536, (h, w, 4)), 6, 16)
    manual("rgb8_adam7.png", photo(h, w, 2), 2, 8, interlace=True)
    manual("gray16_adam7.png", rng.integers(0, 400, (h, w)), 0, 16, interlace=True)
    palette = rng.integers(0, 256, 16 * 3)
    manual("pal4_trns.png", rng.integers(0, 16, (h, w)), 3, 4, palette=palette,
           trns=bytes(rng.integers(0, 256, 10).astype(np.uint8)))
    manual("gray8_trns.png", rng.integers(0, 256, (h, w)), 0, 8, trns=struct.pack(">H", 17))
    manual("rgb8_trns.png", photo(h, w, 3), 2, 8, trns=struct.pack(">HHH", 1, 2, 3))

    big = photo(101, 77, 4)
    pil_save("rgb_q90.jpg", Image.fromarray(big), quality=90)
    pil_save("rgb_444.jpg", Image.fromarray(big), quality=85, subsampling=0)
    pil_save("rgb_422.jpg", Image.fromarray(big), quality=85, subsampling=1)
    pil_save("gray.jpg", Image.fromarray(big[..., 2]), quality=90)
    pil_save("progressive.jpg", Image.fromarray(big), quality=80, progressive=True)
    cmyk = np.dstack([big, big[..., 0] // 2]).astype(np.uint8)
    pil_save("cmyk.jpg", Image.fromarray(cmyk, "CMYK"), quality=90)

    for name in files:
        im = Image.open(os.path.join(out, name))
        im.load()
        stored = 1 if im.mode in ("1", "L", "LA", "I", "I;16") else 3
        if name in ("la16.png",):  # PIL opens 16-bit gray+alpha as RGBA; stored gray
            stored = 1
        rgb_out = np.asarray(im.convert("RGB"))
        l_out = np.asarray(im.convert("L"))
        rgb_out.tofile(os.path.join(out, name + ".rgb"))
        l_out.tofile(os.path.join(out, name + ".l"))
        lines.append(f"codec {name} {stored} {im.size[0]} {im.size[1]}")


def chw(img):
    a = np.asarray(img)
    return a if a.ndim == 2 else a.transpose(2, 0, 1)


def geometry_cases(out, lines):
    a = photo(257, 331, 11)
    Image.fromarray(a).save(os.path.join(out, "geo_a.png"))
    Image.fromarray(a).save(os.path.join(out, "geo_a.jpg"), quality=90)
    Image.fromarray(photo(375, 500, 12)).save(os.path.join(out, "geo_b.jpg"), quality=90)
    Image.fromarray(photo(375, 500, 12)).save(os.path.join(out, "geo_b.png"))
    a_boxes = [
        (0, 0, 257, 331),  # full image
        (10, 20, 1, 1),  # tiny
        (5, 5, 2, 3),
        (200, 300, 57, 31),  # off-centre, bottom right corner
        (0, 0, 100, 20),
        (100, 0, 3, 331),  # aspect extremes
        (0, 160, 257, 4),
        (31, 47, 173, 211),
        (64, 90, 128, 128),
        (-10, -20, 100, 100),  # beyond the image: PIL pads with zeros
        (250, 320, 20, 30),
    ]
    sizes = [224, 64, 17, 1]
    n = 0
    for name in ("geo_a.png", "geo_a.jpg"):
        img = Image.open(os.path.join(out, name)).convert("RGB")
        for i, (top, left, h, w) in enumerate(a_boxes):
            for j, size in enumerate(sizes):
                flip = (i + j) % 2
                for channels in ((3, 1) if j == 1 else (3,)):
                    src = img if channels == 3 else img.convert("L")
                    res = F.resized_crop(src, top, left, h, w, [size, size])
                    if flip:
                        res = F.hflip(res)
                    exp = f"crop_{n}.bin"
                    n += 1
                    chw(res).tofile(os.path.join(out, exp))
                    lines.append(f"crop {name} {channels} {top} {left} {h} {w} {size} {flip} {exp}")
    b_boxes = [(0, 0, 375, 500, 64), (50, 60, 300, 400, 224), (50, 60, 300, 400, 100),
               (50, 60, 300, 400, 32), (17, 33, 211, 307, 50), (100, 1, 260, 270, 120),
               (3, 5, 370, 490, 160), (120, 200, 255, 299, 31)]
    for name in ("geo_b.jpg", "geo_b.png"):
        img = Image.open(os.path.join(out, name)).convert("RGB")
        for i, (top, left, h, w, size) in enumerate(b_boxes):
            res = F.resized_crop(img, top, left, h, w, [size, size])
            exp = f"crop_{n}.bin"
            n += 1
            chw(res).tofile(os.path.join(out, exp))
            lines.append(f"crop {name} 3 {top} {left} {h} {w} {size} 0 {exp}")
    centers = [("geo_a.png", 3, 256, 224), ("geo_a.png", 3, 100, 64), ("geo_a.png", 3, 50, 64),
               ("geo_a.png", 3, 64, 64), ("geo_a.png", 3, 101, 60), ("geo_a.png", 1, 77, 40),
               ("geo_a.png", 3, 300, 301), ("geo_a.png", 3, 20, 331),
               ("geo_b.png", 3, 256, 224), ("geo_b.png", 3, 60, 59),
               ("geo_a.jpg", 3, 256, 224), ("geo_b.jpg", 3, 256, 224), ("geo_b.jpg", 3, 64, 56),
               ("geo_b.jpg", 3, 150, 128)]
    for k, (name, channels, resize, size) in enumerate(centers):
        img = Image.open(os.path.join(out, name)).convert("RGB" if channels == 3 else "L")
        res = T.Compose([T.Resize(resize), T.CenterCrop(size)])(img)
        exp = f"center_{k}.bin"
        chw(res).tofile(os.path.join(out, exp))
        lines.append(f"center {name} {channels} {resize} {size} {exp}")


def bench_cases(out, lines):
    """The image benchmark's first JPEGs (bench/images/make_jpegs.py, seed 1, quality 90, as
    bench/run_image_pipeline.sh makes them), RandomResizedCrop(224) boxes and flips drawn by
    torchvision, and Resize(256) + CenterCrop(224): the fast decode mode's difference is measured
    on them (image_transform_test, FastDecodeOnBenchmarkJpegs)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "make_jpegs", os.path.join(here, "..", "..", "bench", "images", "make_jpegs.py"))
    make_jpegs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_jpegs)
    torch.manual_seed(14)
    crop = T.RandomResizedCrop(224)
    n = 0
    for i in range(16):
        name = f"bench_{i:05d}.jpg"
        Image.fromarray(make_jpegs.image(1, i)[1]).save(os.path.join(out, name), quality=90)
        img = Image.open(os.path.join(out, name)).convert("RGB")
        for j in range(3):
            top, left, h, w = crop.get_params(img, crop.scale, crop.ratio)
            flip = (i + j) % 2
            res = F.resized_crop(img, top, left, h, w, [224, 224])
            if flip:
                res = F.hflip(res)
            exp = f"bench_crop_{n}.bin"
            n += 1
            chw(res).tofile(os.path.join(out, exp))
            lines.append(f"bench {name} 3 {top} {left} {h} {w} 224 {flip} {exp}")
        if i % 4 == 0:
            res = T.Compose([T.Resize(256), T.CenterCrop(224)])(img)
            exp = f"bench_center_{i}.bin"
            chw(res).tofile(os.path.join(out, exp))
            lines.append(f"benchcenter {name} 3 256 224 {exp}")


def rrc_stats(lines):
    torch.manual_seed(0)
    draws = 4000
    for (h, w, smin, smax, rmin, rmax) in [(375, 500, 0.08, 1.0, 3 / 4, 4 / 3),
                                          (300, 1000, 0.08, 1.0, 3 / 4, 4 / 3),
                                          (600, 120, 0.3, 0.9, 0.5, 2.0),
                                          (7, 5, 0.08, 1.0, 3 / 4, 4 / 3)]:
        img = Image.new("L", (w, h))
        areas, logs, fallback = [], [], 0
        in_ratio = w / h
        if in_ratio < rmin:
            fw, fh = w, int(round(w / rmin))
        elif in_ratio > rmax:
            fh, fw = h, int(round(h * rmax))
        else:
            fw, fh = w, h
        fb = ((h - fh) // 2, (w - fw) // 2, fh, fw)
        for _ in range(draws):
            i, j, bh, bw = T.RandomResizedCrop.get_params(img, [smin, smax], [rmin, rmax])
            areas.append(bh * bw / (h * w))
            logs.append(math.log(bw / bh))
            fallback += (i, j, bh, bw) == fb
        areas, logs = np.array(areas), np.array(logs)
        lines.append(f"rrc {h} {w} {smin} {smax} {rmin:.9g} {rmax:.9g} {draws} {areas.mean():.9g} "
                     f"{areas.std():.9g} {logs.mean():.9g} {logs.std():.9g} {fallback / draws:.9g}")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 64
    warnings.simplefilter("ignore")  # PIL's advice on palettes with transparency
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lines = []
    codec_cases(out, lines)
    geometry_cases(out, lines)
    bench_cases(out, lines)
    rrc_stats(lines)
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
