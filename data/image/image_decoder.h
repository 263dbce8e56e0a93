// The streaming decoder under image_codec.h and image_transform.h: opens a JPEG or PNG, optionally
// asks libjpeg for a DCT-scaled image (1/2, 1/4, 1/8), in the fast mode with the fast IDCT and
// plain upsampling, and hands out a rectangle of rows converted
// to 1 or 3 channels (PIL's conversions, see image_codec.h), one row at a time, decoding no row
// below the rectangle and, for JPEG, skipping the rows above it (jpeg_skip_scanlines) and the
// columns beside it (jpeg_crop_scanline).
//
// Internal to data/image: the public entry points are DecodeImage and DecodeTransformed.
//
// Contract: errors are INVALID_ARGUMENT naming the file; the rectangle must lie inside the
// (scaled) image. Data after the last row asked for is not read: a file truncated below the
// rectangle decodes (its pixels there are not used). A decoder is reusable: Open starts over and
// keeps the row buffers (no allocation in this class once warm) and libjpeg's decompress object
// (jpeg_abort_decompress between images, also after an error: only libjpeg's per-image pool is
// allocated again); libpng allocates its state per image. Rows that need no conversion (RGB JPEG
// to 3 channels, gray JPEG to 1) are handed out in libjpeg's own output buffer, not copied.
#ifndef STOKER_DATA_IMAGE_IMAGE_DECODER_H_
#define STOKER_DATA_IMAGE_IMAGE_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "data/image/image_codec.h"

namespace stoker::image_internal {

// libjpeg warnings that mean damaged or missing entropy-coded data: decoders treat them as
// errors (a partly grey image is never handed out).
bool IsFatalJpegWarning(int code);

// The pixel layout a decoder produces before conversion to 1 or 3 channels.
enum class NativeLayout {
  kGray8,       // 1 byte
  kGray16,      // 2 bytes, big-endian (PNG gray 16: PIL's mode "I", clipped to 0..255)
  kGrayAlpha8,  // 2 bytes
  kRgb8,        // 3 bytes
  kRgba8,       // 4 bytes
  kCmyk8,       // 4 bytes, Adobe (inverted) CMYK as libjpeg returns it
};

inline constexpr int kRowSlackBytes = 16;

// The first address at or after `p` that lies `misalign` bytes past a multiple of `align` (a power
// of two; misalign < align). ReadJpegRegion's rows start there (see it for why).
inline uint8_t* AlignedRowStart(uint8_t* p, size_t align, size_t misalign) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = ((a + align - 1 - misalign) & ~(uintptr_t{align} - 1)) + misalign;
  return p + (start - a);
}

// Converts `count` pixels of `layout` to `channels` (1 or 3) as PIL does.
void ConvertPixels(NativeLayout layout, const uint8_t* in, int count, int channels, uint8_t* out);

struct JpegState;
struct PngState;

class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Reads the header of `data` (which must outlive the decoding) and checks the size bounds.
  absl::Status Open(absl::string_view name, const uint8_t* data, size_t size);
  const ImageHeader& header() const { return header_; }

  // JPEG only: decode at 1/denom of the full size (denom 1, 2, 4 or 8); the scaled image is
  // ceil(width / denom) x ceil(height / denom) (libjpeg's rounding). PNG supports only 1.
  // Call after Open and before ReadRegion.
  absl::Status SetScale(int denom);
  // The fast mode (image_transform.h, ImageDecodeMode::kFast): JPEG decodes at eighths/8 of the
  // full size (1, 2, 4 or 8; the same sizes as SetScale), with libjpeg's fast integer IDCT
  // (JDCT_IFAST) and without fancy upsampling. PNG supports only 8 (and decodes as in exact
  // mode). Call after Open and before ReadRegion, instead of SetScale.
  absl::Status SetFastScale(int eighths);
  int scaled_width() const { return scaled_width_; }
  // JPEGs whose region was decoded from a slice of their MCU rows (restart-indexed), so far.
  int64_t sliced_images() const { return sliced_images_; }
  int scaled_height() const { return scaled_height_; }

  // Decodes rows [y0, y1) and columns [x0, x1) of the (scaled) image converted to `channels`,
  // calling `row(y, pixels)` for each y in order, with (x1 - x0) * channels bytes valid until the
  // next call, followed by kRowSlackBytes readable bytes (for the resampler's vector loads). One
  // ReadRegion per Open.
  absl::Status ReadRegion(int channels, int x0, int x1, int y0, int y1,
                          absl::FunctionRef<void(int y, const uint8_t* pixels)> row);

 private:
  absl::Status ReadJpegRegion(int channels, int x0, int x1, int y0, int y1,
                              absl::FunctionRef<void(int, const uint8_t*)> row);
  absl::Status ReadPngRegion(int channels, int x0, int x1, int y0, int y1,
                             absl::FunctionRef<void(int, const uint8_t*)> row);
  absl::Status ReadPngRowsDirect(int channels, int x0, int x1, int y0, int y1,
                                 absl::FunctionRef<void(int, const uint8_t*)> row);
  void Close();  // releases libjpeg's or libpng's state, keeps header()
  absl::Status ApplyScale(unsigned num, unsigned denom, bool fast);
  // A JPEG with a restart marker after every MCU row (jpeg_restart.h) and rows [y0, y1) far
  // enough down: reopens libjpeg on a slice of MCU rows around them, so that the rows above are
  // never Huffman-decoded. The slice's first scaled row is full-image row *first_row; false
  // (nothing changed) when the image has no such index or the slice would start at the top.
  bool OpenJpegSlice(int y0, int y1, int* first_row);

  std::string name_;
  ImageHeader header_;
  int scaled_width_ = 0;
  int scaled_height_ = 0;
  ImageEncoding open_ = ImageEncoding::kUnknown;  // which state below holds an image
  std::unique_ptr<JpegState> jpeg_;               // kept across images
  std::unique_ptr<PngState> png_;
  std::vector<uint8_t> native_row_;     // one decoded row before conversion
  std::vector<uint8_t> converted_row_;  // the region's columns after conversion
  std::vector<uint8_t> whole_image_;    // interlaced PNG only
  std::vector<uint8_t*> row_pointers_;  // into whole_image_
  // JPEG: the data given to Open, the scale asked for, and the slice being decoded.
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  unsigned scale_num_ = 1, scale_denom_ = 1;
  bool fast_ = false;
  std::vector<uint8_t> slice_;
  int64_t sliced_images_ = 0;
};

}  // namespace stoker::image_internal

#endif  // STOKER_DATA_IMAGE_IMAGE_DECODER_H_
