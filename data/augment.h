// Image augmentation done by the loaders: a random crop of a zero-padded image and a random
// horizontal flip, of images {H, W} or channels first {C, H, W} (each channel plane alike).
// Every random choice is a pure function of (seed, batch, position in the batch), so a batch is
// the same whichever loader makes it and after a loader is respawned.
#ifndef STOKER_DATA_AUGMENT_H_
#define STOKER_DATA_AUGMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace stoker {

struct AugmentOptions {
  // Pad each side of the image with this many zero pixels and crop an image of the original
  // size at a random offset (0 = no crop). E.g. 4 for 32x32 CIFAR-style training.
  int crop_padding = 0;
  // Mirror the image left to right with probability 1/2.
  bool horizontal_flip = false;

  bool enabled() const { return crop_padding > 0 || horizontal_flip; }
};

// The random choices for one sample. The crop takes output pixel (y, x) from input pixel
// (y + shift_y, x + shift_x), zero where that lies outside; the flip then mirrors the result.
struct AugmentDraw {
  int shift_y = 0;  // in [-crop_padding, crop_padding]
  int shift_x = 0;
  bool flip = false;
};

AugmentDraw DrawAugment(const AugmentOptions& options, uint64_t seed, uint64_t batch,
                        uint32_t position);

// Checks that `options` fit samples of `sample_dims`: images are {H, W} (one channel) or
// {C, H, W} (channels first, PyTorch's layout: C planes of H x W), and 0 <= crop_padding <=
// min(H, W). Returns INVALID_ARGUMENT otherwise.
absl::Status ValidateAugment(const AugmentOptions& options, const std::vector<int>& sample_dims);

// The geometry of one image sample for CopyAugmented.
struct ImageShape {
  int channels = 1;  // planes, each height x width values
  int height = 0;
  int width = 0;
  int element_bytes = 1;  // bytes per value (1 for uint8, 4 for float32)
};

// The image shape of samples of `sample_dims` ({H, W} or {C, H, W}; ValidateAugment accepts them)
// whose values are `element_bytes` wide.
ImageShape ImageShapeOf(const std::vector<int>& sample_dims, int element_bytes);

// Writes the augmented copy of one image `src` into `dst` (no overlap): every channel plane is
// cropped and flipped by the same draw.
void CopyAugmented(const uint8_t* src, uint8_t* dst, const ImageShape& shape,
                   const AugmentDraw& draw);

}  // namespace stoker

#endif  // STOKER_DATA_AUGMENT_H_
