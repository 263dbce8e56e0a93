// The training and evaluation transforms the loaders apply to image samples, with torchvision
// 0.14's semantics on PIL images (the ImageFolder pipeline a PyTorch user writes):
// - training: RandomResizedCrop(size, scale, ratio) then RandomHorizontalFlip(p = 1/2);
// - evaluation: Resize(resize) (shorter side to `resize`) then CenterCrop(size);
// - fixed-size datasets: no resize or crop, the image must have the expected size.
// A transformed sample is uint8 [channels, size, size], channels first (NCHW once batched).
//
// All randomness is a pure function of `random_bits` (the caller derives it from the seed, the
// batch and the position), so a sample is the same wherever and whenever it is made. The bits
// drive a SplitMix64 generator (state = SplitMix64's mix function of random_bits, so that
// neighbouring values give unrelated streams; each draw adds 0x9e3779b97f4a7c15 to the state and
// returns its mix): draw 0 decides the flip (its top bit), draws 1, 2, ... feed RandomResizedCrop's
// get_params in torchvision's order (per attempt a uniform for the scale, one for the log
// aspect ratio, and when the box fits a randint for the top, then one for the left). Uniforms are
// (draw >> 11) * 2^-53; randint(0, n) is the high 64 bits of draw * n (bias below 2^-47 for the
// sizes allowed). Python's round() is reproduced as round-half-to-even.
//
// How the pixels differ from torchvision + PIL:
// - PNG: they do not. The decode is exact and the resampling is PIL's (image_resample.h) to the
//   bit; image_test checks max |diff| <= 1 against torchvision.
// - JPEG, same pixels when the decode is full-size: libjpeg-turbo with PIL's settings (accurate
//   integer IDCT, fancy upsampling); only the rows and columns the crop needs are decoded
//   (jpeg_skip_scanlines, jpeg_crop_scanline), which image_test measures to be exact or within
//   1 at the crop's edges.
// - JPEG with DCT scaling: when the crop box lies inside the image and is at least 2, 4 or 8
//   times the output size in both dimensions (for Resize + CenterCrop: the image at least that
//   many times the resized image), libjpeg decodes the image at 1/2, 1/4 or 1/8 size (its scaled
//   IDCT) and the bilinear resize starts from there (the box scaled by the same factor, the resize
//   still a downscale). PIL resizes the full-size decode instead, so pixels differ (a slightly
//   different low-pass); image_test reports the mean and max difference and bounds them.
// - JPEG in the fast decode mode (ImageDecodeMode::kFast, opt-in: the job's
//   dataset.image.decode: fast): the same crop box, flip and DCT scale as above, but libjpeg-turbo
//   decodes with its fast integer IDCT (JDCT_IFAST) and without fancy upsampling (chroma
//   replicated instead of interpolated, merged with the colour conversion), and the resize's
//   horizontal pass sums RGB rows with 14-bit weights (image_resample.h: within 1 of PIL's
//   arithmetic). On the image benchmark's noisy q90 JPEGs a sample differs from torchvision's by
//   ~4 levels on average, almost all from the chroma upsampling; image_test measures and bounds
//   it. PNG decodes exactly in both modes, and so do size-0 (no resize) datasets. libjpeg-turbo
//   can also scale by 3/8, 5/8, 6/8 and 7/8 (the smallest M/8 still covering the output would be
//   used), but its IDCTs for those sizes (and the 10x10 .. 14x14 chroma blocks they bring with
//   4:2:0) are scalar C: measured on the image benchmark's JPEGs, allowing them made the
//   transform ~8% slower than decoding at 8/8, and slower than 1/2 on images twice that size, so
//   the fast mode keeps the powers of two.
#ifndef STOKER_DATA_IMAGE_IMAGE_TRANSFORM_H_
#define STOKER_DATA_IMAGE_IMAGE_TRANSFORM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stoker {

// A crop in the full-size image's pixels (it may extend beyond the image: zero padding).
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// How JPEG pixels are decoded (see the header comment). Values are not stored anywhere.
enum class ImageDecodeMode {
  kExact,  // PIL's settings: torchvision's pixels (DCT scaling only at >= 2x, see above)
  kFast,   // DCT scaling to M/8, JDCT_IFAST, no fancy upsampling
};

struct ImageTransform {
  int channels = 3;  // 1 or 3
  // Output side. 0 = no resize or crop: the image must be exactly expect_height x expect_width
  // (else INVALID_ARGUMENT) and the output is channels x expect_height x expect_width.
  int size = 0;
  int expect_height = 0;
  int expect_width = 0;
  // Deterministic mode (random_resized_crop false): the shorter side is resized to `resize`
  // (0 = size), then the center size x size is cropped (zero-padded when smaller).
  int resize = 0;
  // Training: torchvision RandomResizedCrop(size, scale, ratio).
  bool random_resized_crop = false;
  float scale_min = 0.08f;
  float scale_max = 1.0f;
  float ratio_min = 3.0f / 4;
  float ratio_max = 4.0f / 3;
  // Training: mirror left to right with p = 1/2 (after the resize), in every mode.
  bool horizontal_flip = false;
  // JPEG decoding: exact (torchvision's pixels) or fast. The crop box and flip do not depend on
  // it.
  ImageDecodeMode decode = ImageDecodeMode::kExact;
};

// INVALID_ARGUMENT naming the field when `t` is not usable: channels 1 or 3, size in 0..4096,
// with size 0 expect_height and expect_width in 1..65535 and no random_resized_crop, resize >= 0,
// 0 < scale_min <= scale_max <= 1, 0 < ratio_min <= ratio_max.
absl::Status ValidateImageTransform(const ImageTransform& t);

// channels * size * size, or channels * expect_height * expect_width when size is 0.
size_t TransformOutputBytes(const ImageTransform& t);

// torchvision 0.14's RandomResizedCrop.get_params for a height x width image: 10 attempts at a
// box of area fraction U(scale_min, scale_max) and aspect exp(U(log ratio_min, log ratio_max)),
// then the ratio-clamped center box. Draws as the header says (from draw 1 of random_bits).
// Always inside the image, at least 1 x 1.
CropBox DrawRandomResizedCrop(const ImageTransform& t, int height, int width, uint64_t random_bits);

// RandomHorizontalFlip's coin: the top bit of draw 0 of random_bits.
bool DrawHorizontalFlip(uint64_t random_bits);

// torchvision Resize(resize) + CenterCrop(size) on a height x width image. The resized image is
// resized_height x resized_width (shorter side = resize, the other
// int(resize * long / short)); the output takes its rows [top, top + size) and columns
// [left, left + size), negative or beyond it where CenterCrop pads with zeros (top = -pad_top
// then). As a box of the original image: rows [top * height / resized_height, ...), i.e. PIL's
// resize with a fractional box, which is how it is computed (exactly).
struct CenterCropPlan {
  int resized_height = 0;
  int resized_width = 0;
  int top = 0;
  int left = 0;
};
CenterCropPlan PlanResizeCenterCrop(int height, int width, int resize, int size);

// Reusable decode and resize buffers (one per loader thread). Once warm (after an image of the
// largest size seen) a transform allocates nothing itself; libjpeg's decompress object is reused
// (its per-image pool is still allocated), libpng allocates its per-image state.
struct TransformScratch {
  TransformScratch();
  ~TransformScratch();
  TransformScratch(const TransformScratch&) = delete;
  TransformScratch& operator=(const TransformScratch&) = delete;
  struct State;
  std::unique_ptr<State> state;
};

// Decodes `data` (JPEG or PNG, see image_codec.h) and writes its transformed sample,
// TransformOutputBytes(t) bytes, to `out`. INVALID_ARGUMENT naming `name` for a bad image or a
// size mismatch (size 0), or for a bad `t`. `out` is unspecified after an error.
absl::Status DecodeTransformed(absl::string_view name, const uint8_t* data, size_t size,
                               const ImageTransform& t, uint64_t random_bits, uint8_t* out,
                               TransformScratch* scratch);

// torchvision's resized_crop(img, top, left, height, width, [out_size, out_size]) (+ hflip) as
// DecodeTransformed runs it, with a given box and flip: out gets channels * out_size * out_size
// bytes. `dct_scaling` false decodes JPEG at full size always (for measuring what it changes;
// in the fast mode: at 8/8, still with the fast IDCT and upsampling).
absl::Status DecodeCropResize(absl::string_view name, const uint8_t* data, size_t size,
                              int channels, const CropBox& box, int out_size, bool flip,
                              uint8_t* out, TransformScratch* scratch, bool dct_scaling = true,
                              ImageDecodeMode decode = ImageDecodeMode::kExact);

// The JPEG DCT scale a crop decodes at, as the M of M/8 (8 = full size), for a box of
// box_height x box_width to out_height x out_width: 1, 2 or 4 (1/8, 1/4, 1/2) when the box is at
// least 8, 4 or 2 times the output in both dimensions, else 8; the same in both decode modes.
// (For benchmarks and tests; the transform also decodes at 8/8 when the box reaches beyond the
// image.)
int JpegScaleEighths(double box_height, double box_width, int out_height, int out_width);

}  // namespace stoker

#endif  // STOKER_DATA_IMAGE_IMAGE_TRANSFORM_H_
