#include "data/image/image_transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "data/image/image_decoder.h"
#include "data/image/image_resample.h"

namespace stoker {

struct TransformScratch::State {
  image_internal::ImageDecoder decoder;
  image_internal::AxisTaps columns;
  image_internal::AxisTaps rows;
  std::vector<uint8_t> horizontal;  // the horizontal pass's rows (taps' source rows)
  std::vector<int32_t> accumulator;
  std::vector<uint8_t> out_row;
};

TransformScratch::TransformScratch() : state(std::make_unique<State>()) {}
TransformScratch::~TransformScratch() = default;

namespace {

constexpr int kMaxOutputSide = 4096;

class SplitMix64 {
 public:
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // The state starts at Mix(seed), not at seed: seeds one increment apart would otherwise give
  // the same stream shifted by one draw.
  explicit SplitMix64(uint64_t seed) : state_(Mix(seed)) {}
  uint64_t Next() { return Mix(state_ += 0x9e3779b97f4a7c15ULL); }
  // torch's uniform_(a, b): a + (b - a) * U[0, 1).
  double Uniform(double a, double b) {
    return a + (b - a) * (static_cast<double>(Next() >> 11) * 0x1.0p-53);
  }
  // torch.randint(0, n): an integer in [0, n).
  int RandInt(int n) {
    return static_cast<int>((static_cast<unsigned __int128>(Next()) * static_cast<uint64_t>(n)) >>
                            64);
  }

 private:
  uint64_t state_;
};

// Python's round() on a double: halves go to the even neighbour.
int64_t RoundHalfEven(double x) {
  const double f = std::floor(x);
  const double diff = x - f;
  int64_t r = static_cast<int64_t>(f);
  if (diff > 0.5 || (diff == 0.5 && (r % 2 != 0))) ++r;
  return r;
}

// One axis of a crop/resize in the full-size image's coordinates: an AxisSpec whose image_size
// ScaleAxis fills in for the decoded (possibly DCT-scaled) image.
using AxisPlan = image_internal::AxisSpec;

AxisPlan CropAxis(int lo, int extent, int out_size) {
  return AxisPlan{lo, lo + extent, 0.0, static_cast<double>(extent), out_size, 0, out_size};
}

// The axis at num/denom of the full size: the window widened to whole scaled pixels, the box
// scaled and made relative to the new window. (Exact mode's num is 1: the arithmetic is the
// division by denom it always was.)
image_internal::AxisSpec ScaleAxis(const AxisPlan& p, int num, int denom, int scaled_size) {
  image_internal::AxisSpec s;
  s.out_full = p.out_full;
  s.out_begin = p.out_begin;
  s.out_count = p.out_count;
  s.image_size = scaled_size;
  if (num == denom) {
    s.window_lo = p.window_lo;
    s.window_hi = p.window_hi;
    s.in0 = p.in0;
    s.in1 = p.in1;
    return s;
  }
  s.window_lo = static_cast<int>(std::floor(static_cast<double>(p.window_lo) * num / denom));
  s.window_hi = std::min(
      scaled_size, static_cast<int>(std::ceil(static_cast<double>(p.window_hi) * num / denom)));
  s.in0 = (p.window_lo + p.in0) * num / denom - s.window_lo;
  s.in1 = (p.window_lo + p.in1) * num / denom - s.window_lo;
  return s;
}

// Decodes what the plans need from the opened decoder and writes the CHW sample.
absl::Status ResizeOpened(int channels, const AxisPlan& rows, const AxisPlan& columns, bool flip,
                          bool dct_scaling, ImageDecodeMode decode, uint8_t* out,
                          TransformScratch::State* s) {
  int eighths = 8;
  const ImageHeader& header = s->decoder.header();
  // Not for a box reaching beyond the image: the zero padding's edge would fall inside a scaled
  // pixel.
  const bool inside = rows.window_lo >= 0 && rows.window_hi <= header.height &&
                      columns.window_lo >= 0 && columns.window_hi <= header.width;
  if (dct_scaling && inside && header.encoding == ImageEncoding::kJpeg) {
    eighths = JpegScaleEighths(rows.in1 - rows.in0, columns.in1 - columns.in0, rows.out_full,
                               columns.out_full);
  }
  // Exact mode as num/denom = 1/(8/eighths); the fast mode as eighths/8.
  const bool fast = decode == ImageDecodeMode::kFast;
  const int num = fast ? eighths : 1;
  const int denom = fast ? 8 : 8 / eighths;
  if (absl::Status st = fast ? s->decoder.SetFastScale(eighths) : s->decoder.SetScale(denom);
      !st.ok()) {
    return st;
  }
  const int width = s->decoder.scaled_width();
  const int height = s->decoder.scaled_height();
  image_internal::ComputeAxisTaps(ScaleAxis(columns, num, denom, width), flip, &s->columns);
  image_internal::ComputeAxisTaps(ScaleAxis(rows, num, denom, height), false, &s->rows);
  const int out_w = columns.out_count;
  const int out_h = rows.out_count;
  const size_t row_bytes = static_cast<size_t>(out_w) * channels;
  const image_internal::AxisTaps& ct = s->columns;
  const image_internal::AxisTaps& rt = s->rows;
  if (ct.src_lo >= ct.src_hi || rt.src_lo >= rt.src_hi) {
    // The box lies wholly outside the image: all padding.
    std::memset(out, 0, row_bytes * out_h);
    return absl::OkStatus();
  }
  s->horizontal.resize(row_bytes * static_cast<size_t>(rt.src_hi - rt.src_lo) +
                       image_internal::kResampleSlackBytes);
  uint8_t* horizontal = s->horizontal.data();
  // The fast mode's 14-bit horizontal pass is for JPEG only: PNG stays exact in both modes.
  const bool fast_horizontal = fast && header.encoding == ImageEncoding::kJpeg;
  const absl::Status status = s->decoder.ReadRegion(
      channels, ct.src_lo, ct.src_hi, rt.src_lo, rt.src_hi, [&](int y, const uint8_t* pixels) {
        uint8_t* dst = horizontal + (y - rt.src_lo) * row_bytes;
        if (fast_horizontal) {
          image_internal::ResampleRowHorizontalFast(ct, pixels, ct.src_lo, channels, dst);
        } else {
          image_internal::ResampleRowHorizontal(ct, pixels, ct.src_lo, channels, dst);
        }
      });
  if (!status.ok()) return status;
  s->accumulator.resize(row_bytes);
  s->out_row.resize(row_bytes + image_internal::kResampleSlackBytes);
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  for (int oy = 0; oy < out_h; ++oy) {
    if (channels == 1) {
      image_internal::ResampleRowVertical(rt, oy, horizontal, rt.src_lo,
                                          static_cast<int>(row_bytes), s->accumulator.data(),
                                          out + oy * row_bytes);
      continue;
    }
    image_internal::ResampleRowVertical(rt, oy, horizontal, rt.src_lo, static_cast<int>(row_bytes),
                                        s->accumulator.data(), s->out_row.data());
    uint8_t* r = out + static_cast<size_t>(oy) * out_w;
    image_internal::DeinterleaveRgb(s->out_row.data(), out_w, r, r + plane, r + 2 * plane);
  }
  return absl::OkStatus();
}

// size 0: the whole image, which must have the expected size, to CHW (mirrored with `flip`).
absl::Status CopyOpened(absl::string_view name, const ImageTransform& t, bool flip, uint8_t* out,
                        TransformScratch::State* s) {
  const ImageHeader& h = s->decoder.header();
  if (h.width != t.expect_width || h.height != t.expect_height) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: image is %d x %d (width x height), the dataset's images are %d x %d",
                        name, h.width, h.height, t.expect_width, t.expect_height));
  }
  const int channels = t.channels;
  const size_t plane = static_cast<size_t>(h.width) * h.height;
  const int w = h.width;
  return s->decoder.ReadRegion(channels, 0, w, 0, h.height, [&](int y, const uint8_t* pixels) {
    uint8_t* first = out + static_cast<size_t>(y) * w;
    if (!flip && channels == 1) {
      std::memcpy(first, pixels, w);
      return;
    }
    if (!flip) {
      image_internal::DeinterleaveRgb(pixels, w, first, first + plane, first + 2 * plane);
      return;
    }
    for (int c = 0; c < channels; ++c) {
      uint8_t* dst = out + c * plane + static_cast<size_t>(y) * w;
      for (int x = 0; x < w; ++x) dst[flip ? w - 1 - x : x] = pixels[x * channels + c];
    }
  });
}

}  // namespace

absl::Status ValidateImageTransform(const ImageTransform& t) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("image transform: ", what));
  };
  if (t.channels != 1 && t.channels != 3) {
    return bad(absl::StrFormat("channels is %d (1 or 3)", t.channels));
  }
  if (t.size < 0 || t.size > kMaxOutputSide) {
    return bad(absl::StrFormat("size is %d (0 to %d)", t.size, kMaxOutputSide));
  }
  if (t.size == 0) {
    if (t.expect_height < 1 || t.expect_height > kMaxImageSide || t.expect_width < 1 ||
        t.expect_width > kMaxImageSide) {
      return bad(absl::StrFormat(
          "size 0 (no resize) needs expect_height and expect_width in 1..%d, got %d x %d",
          kMaxImageSide, t.expect_height, t.expect_width));
    }
    if (t.random_resized_crop) return bad("random_resized_crop needs a size");
  }
  if (t.resize < 0 || t.resize > kMaxImageSide) {
    return bad(absl::StrFormat("resize is %d (0 to %d)", t.resize, kMaxImageSide));
  }
  if (!(t.scale_min > 0 && t.scale_min <= t.scale_max && t.scale_max <= 1)) {
    return bad(absl::StrFormat("scale is [%g, %g] (0 < scale_min <= scale_max <= 1)", t.scale_min,
                               t.scale_max));
  }
  if (!(t.ratio_min > 0 && t.ratio_min <= t.ratio_max && std::isfinite(t.ratio_max))) {
    return bad(absl::StrFormat("ratio is [%g, %g] (0 < ratio_min <= ratio_max)", t.ratio_min,
                               t.ratio_max));
  }
  return absl::OkStatus();
}

size_t TransformOutputBytes(const ImageTransform& t) {
  if (t.size == 0) return static_cast<size_t>(t.channels) * t.expect_height * t.expect_width;
  return static_cast<size_t>(t.channels) * t.size * t.size;
}

bool DrawHorizontalFlip(uint64_t random_bits) {
  SplitMix64 rng(random_bits);
  return (rng.Next() >> 63) != 0;
}

CropBox DrawRandomResizedCrop(const ImageTransform& t, int height, int width,
                              uint64_t random_bits) {
  SplitMix64 rng(random_bits);
  rng.Next();  // draw 0 is the flip's
  const double area = static_cast<double>(height) * width;
  const double log_ratio_min = std::log(static_cast<double>(t.ratio_min));
  const double log_ratio_max = std::log(static_cast<double>(t.ratio_max));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(t.scale_min, t.scale_max);
    const double aspect = std::exp(rng.Uniform(log_ratio_min, log_ratio_max));
    const int64_t w = RoundHalfEven(std::sqrt(target_area * aspect));
    const int64_t h = RoundHalfEven(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      CropBox box;
      box.height = static_cast<int>(h);
      box.width = static_cast<int>(w);
      box.top = rng.RandInt(height - box.height + 1);
      box.left = rng.RandInt(width - box.width + 1);
      return box;
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int64_t w = width, h = height;
  if (in_ratio < t.ratio_min) {
    h = RoundHalfEven(w / static_cast<double>(t.ratio_min));
  } else if (in_ratio > t.ratio_max) {
    w = RoundHalfEven(h * static_cast<double>(t.ratio_max));
  }
  CropBox box;
  box.height = static_cast<int>(std::clamp<int64_t>(h, 1, height));
  box.width = static_cast<int>(std::clamp<int64_t>(w, 1, width));
  box.top = (height - box.height) / 2;
  box.left = (width - box.width) / 2;
  return box;
}

CenterCropPlan PlanResizeCenterCrop(int height, int width, int resize, int size) {
  CenterCropPlan plan;
  const int64_t short_side = std::min(height, width);
  const int64_t long_side = std::max(height, width);
  const int new_long =
      static_cast<int>(static_cast<double>(resize * long_side) / static_cast<double>(short_side));
  plan.resized_width = width <= height ? resize : new_long;
  plan.resized_height = width <= height ? new_long : resize;
  auto offset = [size](int resized) -> int {
    if (size > resized) return -((size - resized) / 2);  // CenterCrop pads, then crops at 0
    return static_cast<int>(RoundHalfEven((resized - size) / 2.0));
  };
  plan.top = offset(plan.resized_height);
  plan.left = offset(plan.resized_width);
  return plan;
}

absl::Status DecodeTransformed(absl::string_view name, const uint8_t* data, size_t size,
                               const ImageTransform& t, uint64_t random_bits, uint8_t* out,
                               TransformScratch* scratch) {
  if (absl::Status st = ValidateImageTransform(t); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", st.message()));
  }
  TransformScratch::State* s = scratch->state.get();
  if (absl::Status st = s->decoder.Open(name, data, size); !st.ok()) return st;
  const bool flip = t.horizontal_flip && DrawHorizontalFlip(random_bits);
  if (t.size == 0) return CopyOpened(name, t, flip, out, s);
  const int height = s->decoder.header().height;
  const int width = s->decoder.header().width;
  AxisPlan rows, columns;
  if (t.random_resized_crop) {
    const CropBox box = DrawRandomResizedCrop(t, height, width, random_bits);
    rows = CropAxis(box.top, box.height, t.size);
    columns = CropAxis(box.left, box.width, t.size);
  } else {
    const CenterCropPlan plan =
        PlanResizeCenterCrop(height, width, t.resize > 0 ? t.resize : t.size, t.size);
    rows = AxisPlan{0,        height, 0.0, static_cast<double>(height), plan.resized_height,
                    plan.top, t.size};
    columns =
        AxisPlan{0, width, 0.0, static_cast<double>(width), plan.resized_width, plan.left, t.size};
  }
  return ResizeOpened(t.channels, rows, columns, flip, /*dct_scaling=*/true, t.decode, out, s);
}

// The largest DCT scaling (1/8, 1/4, 1/2) under which both axes still shrink (the box, scaled,
// is at least as large as the whole resize's output).
int JpegScaleEighths(double box_height, double box_width, int out_height, int out_width) {
  for (int denom : {8, 4, 2}) {
    if (box_height >= static_cast<double>(out_height) * denom &&
        box_width >= static_cast<double>(out_width) * denom) {
      return 8 / denom;
    }
  }
  return 8;
}

absl::Status DecodeCropResize(absl::string_view name, const uint8_t* data, size_t size,
                              int channels, const CropBox& box, int out_size, bool flip,
                              uint8_t* out, TransformScratch* scratch, bool dct_scaling,
                              ImageDecodeMode decode) {
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d channels asked for (1 or 3)", name, channels));
  }
  if (out_size < 1 || out_size > kMaxOutputSide || box.height < 1 || box.width < 1 ||
      box.height > kMaxImageSide || box.width > kMaxImageSide ||
      std::abs(box.top) > kMaxImageSide || std::abs(box.left) > kMaxImageSide) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: crop box top %d left %d height %d width %d to %d x %d is out of range",
                        name, box.top, box.left, box.height, box.width, out_size, out_size));
  }
  TransformScratch::State* s = scratch->state.get();
  if (absl::Status st = s->decoder.Open(name, data, size); !st.ok()) return st;
  return ResizeOpened(channels, CropAxis(box.top, box.height, out_size),
                      CropAxis(box.left, box.width, out_size), flip, dct_scaling, decode, out, s);
}

}  // namespace stoker
