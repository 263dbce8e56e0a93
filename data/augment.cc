#include "data/augment.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/split_mix.h"

namespace stoker {
namespace {

// A value in [0, n) from 32 random bits (multiply-shift; the bias is below n / 2^32).
int Below(uint32_t bits, int n) {
  return static_cast<int>((uint64_t{bits} * static_cast<uint32_t>(n)) >> 32);
}

}  // namespace

AugmentDraw DrawAugment(const AugmentOptions& options, uint64_t seed, uint64_t batch,
                        uint32_t position) {
  // A distinct constant keeps these draws unrelated to the shuffle, which uses the same seed.
  const uint64_t bits =
      SplitMix64(SplitMix64(SplitMix64(seed ^ 0x6175676d656e7421ull) ^ batch) ^ position);
  AugmentDraw draw;
  const int p = options.crop_padding;
  if (p > 0) {
    draw.shift_y = Below(static_cast<uint32_t>(bits), 2 * p + 1) - p;
    draw.shift_x = Below(static_cast<uint32_t>(bits >> 32), 2 * p + 1) - p;
  }
  // The flip takes a bit of one more mix, so it is independent of the crop's bits.
  draw.flip = options.horizontal_flip && (SplitMix64(bits) & 1) != 0;
  return draw;
}

absl::Status ValidateAugment(const AugmentOptions& options, const std::vector<int>& sample_dims) {
  if (!options.enabled()) return absl::OkStatus();
  if (sample_dims.size() != 2 && sample_dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "augmentation needs images of shape {H, W} or {C, H, W} (channels first); the samples "
        "have shape {",
        absl::StrJoin(sample_dims, ", "), "}"));
  }
  const ImageShape shape = ImageShapeOf(sample_dims, 1);
  const int limit = std::min(shape.height, shape.width);
  if (options.crop_padding < 0 || options.crop_padding > limit) {
    return absl::InvalidArgumentError(absl::StrCat("augment crop_padding ", options.crop_padding,
                                                   " must be in [0, ", limit, "] for images of ",
                                                   shape.height, "x", shape.width));
  }
  return absl::OkStatus();
}

ImageShape ImageShapeOf(const std::vector<int>& sample_dims, int element_bytes) {
  ImageShape shape;
  shape.element_bytes = element_bytes;
  if (sample_dims.size() == 3) {
    shape.channels = sample_dims[0];
    shape.height = sample_dims[1];
    shape.width = sample_dims[2];
  } else if (sample_dims.size() == 2) {
    shape.height = sample_dims[0];
    shape.width = sample_dims[1];
  }
  return shape;
}

namespace {

// One plane of height x width values of `value_bytes` each.
void CopyAugmentedPlane(const uint8_t* src, uint8_t* dst, int height, int width, int value_bytes,
                        const AugmentDraw& draw) {
  const size_t row_bytes = static_cast<size_t>(width) * value_bytes;
  // Output columns [x_begin, x_end) have a source column; the rest are padding.
  const int x_begin = std::clamp(-draw.shift_x, 0, width);
  const int x_end = std::clamp(width - draw.shift_x, 0, width);
  for (int y = 0; y < height; ++y) {
    uint8_t* out = dst + y * row_bytes;
    const int sy = y + draw.shift_y;
    if (sy < 0 || sy >= height || x_begin >= x_end) {
      std::memset(out, 0, row_bytes);
      continue;
    }
    const uint8_t* in = src + sy * row_bytes;
    if (!draw.flip) {
      std::memset(out, 0, x_begin * value_bytes);
      std::memcpy(out + x_begin * value_bytes, in + (x_begin + draw.shift_x) * value_bytes,
                  static_cast<size_t>(x_end - x_begin) * value_bytes);
      std::memset(out + x_end * value_bytes, 0, static_cast<size_t>(width - x_end) * value_bytes);
      continue;
    }
    // Flipped: output column x shows cropped column width-1-x.
    for (int x = 0; x < width; ++x) {
      const int cx = width - 1 - x;
      uint8_t* o = out + x * value_bytes;
      if (cx < x_begin || cx >= x_end) {
        std::memset(o, 0, value_bytes);
      } else {
        std::memcpy(o, in + (cx + draw.shift_x) * value_bytes, value_bytes);
      }
    }
  }
}

}  // namespace

void CopyAugmented(const uint8_t* src, uint8_t* dst, const ImageShape& shape,
                   const AugmentDraw& draw) {
  const size_t plane_bytes =
      static_cast<size_t>(shape.height) * shape.width * static_cast<size_t>(shape.element_bytes);
  for (int c = 0; c < shape.channels; ++c) {
    CopyAugmentedPlane(src + c * plane_bytes, dst + c * plane_bytes, shape.height, shape.width,
                       shape.element_bytes, draw);
  }
}

}  // namespace stoker
