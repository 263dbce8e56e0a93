// Image augmentation done by the loaders: a random crop of a zero-padded image and a random
// horizontal flip. Every random choice is a pure function of (seed, batch, position in the batch),
// so a batch is the same whichever loader makes it and after a loader is respawned.
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

// Checks that `options` fit samples of `sample_dims`: images are {H, W} or {H, W, C} (channels
// last), and 0 <= crop_padding <= min(H, W). Returns INVALID_ARGUMENT otherwise.
absl::Status ValidateAugment(const AugmentOptions& options, const std::vector<int>& sample_dims);

// Writes the augmented copy of one image `src` into `dst` (no overlap). The image is
// height x width pixels of `pixel_bytes` bytes each (channels x element size).
void CopyAugmented(const uint8_t* src, uint8_t* dst, int height, int width, int pixel_bytes,
                   const AugmentDraw& draw);

}  // namespace stoker

#endif  // STOKER_DATA_AUGMENT_H_
