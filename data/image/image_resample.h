// PIL's bilinear resampling (Image.resize(size, BILINEAR, box)), which torchvision's Resize and
// RandomResizedCrop run on PIL images, as precomputed taps per output row and column and two
// passes (horizontal, then vertical, with an 8-bit intermediate as PIL has), and the RGB to
// planes de-interleave of the CHW sample.
//
// The facts reproduced (from PIL's documented behaviour and measured against it in image_test):
// - for output index i of an axis resized from the box [in0, in1) to n outputs,
//   scale = (in1 - in0) / n, filterscale = max(scale, 1), support = filterscale (the triangle
//   filter's support 1 widened by the downscale: antialiasing), center = in0 + (i + 0.5) * scale,
//   taps over source pixels [int(center - support + 0.5), int(center + support + 0.5)) clipped to
//   the image, weight of pixel x = max(0, 1 - |(x - center + 0.5) / filterscale|), normalised to
//   sum 1;
// - weights in fixed point with 22 fraction bits, rounded half away from zero; a pass sums
//   pixel * weight from 2^21 (so the >> 22 rounds) and clamps to 0..255.
//
// Internal to data/image (image_transform.cc uses it; image_test checks it against PIL).
#ifndef STOKER_DATA_IMAGE_IMAGE_RESAMPLE_H_
#define STOKER_DATA_IMAGE_IMAGE_RESAMPLE_H_

#include <cstdint>
#include <vector>

namespace stoker::image_internal {

inline constexpr int kResampleFractionBits = 22;

// One axis of a resize, in PIL's terms, generalised to cover torchvision's crop, pad and
// center-crop around it:
// - the taps are clipped to the window [window_lo, window_hi) of source positions (PIL clips to
//   its input image: for torchvision's crop-then-resize the input is the crop, so the window is
//   the crop box; for a resize of the whole image it is [0, size));
// - the box [in0, in1) is relative to window_lo (fractional when the source is a DCT-scaled
//   JPEG);
// - out_full outputs make the whole resize; this axis produces outputs
//   [out_begin, out_begin + out_count) of it, and those outside [0, out_full) are 0 (the zero
//   padding of torchvision's CenterCrop);
// - source positions outside [0, image_size) are zero pixels (PIL's crop pads with zeros): their
//   taps are dropped, keeping the other weights as they are.
struct AxisSpec {
  int window_lo = 0;
  int window_hi = 0;
  double in0 = 0;
  double in1 = 0;
  int out_full = 0;
  int out_begin = 0;
  int out_count = 0;
  int image_size = 0;
};

// Precomputed taps: output o reads source positions [start[o], start[o] + count[o]) with
// weights coeffs[o * ksize ...]. `start` is absolute (source coordinates); count may be 0
// (output 0). [src_lo, src_hi) is the union of all taps (empty when src_lo >= src_hi).
//
// The same taps with one length for every output, for the vector passes (a loop whose trip count
// does not change from output to output is predicted; PIL's varying counts cost a mispredicted
// branch per output): output o reads [fixed_start[o], fixed_start[o] + fixed_k) inside
// [src_lo, src_hi) with weights fixed_coeffs[o * fixed_k ...], the taps above shifted into place
// and zeros around them (a zero weight adds exactly 0, so the sums are PIL's).
// fixed_k = the largest count (at most ksize and src_hi - src_lo); fixed_coeffs has
// kFixedCoeffSlack zeros after its end.
struct AxisTaps {
  int ksize = 0;
  int src_lo = 0;
  int src_hi = 0;
  std::vector<int32_t> coeffs;
  std::vector<int32_t> start;
  std::vector<int32_t> count;
  int fixed_k = 0;
  std::vector<int32_t> fixed_coeffs;
  std::vector<int32_t> fixed_start;
  // The fixed taps in pairs for the AVX2 horizontal pass of RGB rows: for output o and pair j
  // (taps 2j, 2j + 1; the second 0 past fixed_k), 8 values {c0, c0, c0, c1, c1, c1, 0, 0} at
  // pair_coeffs[(o * pairs + j) * 8], the weights of bytes 6j .. 6j + 7 of the output's pixels.
  int pairs = 0;
  std::vector<int32_t> pair_coeffs;
  // The same pairs with 14-bit weights for the fast decode mode's horizontal pass: for output o
  // and pair j, 8 values {c0, c1, c0, c1, c0, c1, 0, 0} at pair_coeffs16[(o * pairs + j) * 8],
  // each the 22-bit weight rounded to 14 bits.
  std::vector<int16_t> pair_coeffs16;
};
inline constexpr int kFixedCoeffSlack = 8;

// Fills `taps` (reusing its vectors). With `reverse`, output o gets the taps of output
// out_count - 1 - o (a horizontal flip after the resize).
void ComputeAxisTaps(const AxisSpec& spec, bool reverse, AxisTaps* taps);

// Both passes have vector versions (SSE4.1, and AVX2 on CPUs that have it; 32-bit multiplies of
// the same integer arithmetic, so the same bytes) chosen at run time, and a portable one. Their
// buffers need slack: kResampleSlackBytes readable bytes after the last pixel of `row`, and as
// many writable bytes after the end of `out` (the vector code loads up to 8 bytes for the last
// tap and stores 4 bytes per 3-byte pixel).
inline constexpr int kResampleSlackBytes = 16;

// Horizontal pass of one row: `row` holds source columns [row_lo, ...) with `channels` (1 or 3)
// interleaved bytes each, and covers every tap; writes taps.start.size() pixels to `out`.
void ResampleRowHorizontal(const AxisTaps& taps, const uint8_t* row, int row_lo, int channels,
                           uint8_t* out);

// The fast decode mode's horizontal pass: as ResampleRowHorizontal, but RGB rows are summed with
// 14-bit weights (pair_coeffs16; 16-bit multiply-adds, no 32-bit multiplies), so outputs may differ
// from PIL's by 1. The AVX2 and portable versions give the same bytes (other CPUs use the
// portable one); 1-channel rows take ResampleRowHorizontal.
void ResampleRowHorizontalFast(const AxisTaps& taps, const uint8_t* row, int row_lo, int channels,
                               uint8_t* out);

// Vertical pass: `rows` holds source rows [rows_lo, ...) of `row_bytes` bytes each (the
// horizontal pass's output), covering every tap; writes output row `o` (row_bytes bytes) to
// `out`, using `acc` (row_bytes int32 values) as the portable version's accumulator.
void ResampleRowVertical(const AxisTaps& taps, int o, const uint8_t* rows, int rows_lo,
                         int row_bytes, int32_t* acc, uint8_t* out);

// `count` RGB pixels (3 * count bytes, interleaved) to three planes (the sample's CHW layout).
void DeinterleaveRgb(const uint8_t* rgb, int count, uint8_t* r, uint8_t* g, uint8_t* b);

// Which versions run: the best the CPU has unless tests cap it (kPortable to compare).
enum class ResampleLevel { kPortable = 0, kSse41 = 1, kAvx2 = 2 };
ResampleLevel ResampleBestLevel();  // what the CPU supports
ResampleLevel ResampleActiveLevel();
void SetResampleLevelForTesting(ResampleLevel cap);

// Whether a vector version runs; tests switch them off to compare.
bool ResampleUsesSimd();
void SetResampleSimdForTesting(bool enabled);

}  // namespace stoker::image_internal

#endif  // STOKER_DATA_IMAGE_IMAGE_RESAMPLE_H_
