// Decoding and encoding of the two image formats the image datasets hold, JPEG (libjpeg-turbo)
// and PNG (libpng), with the pixel conventions of PIL, which torchvision's ImageFolder loader uses
// (`Image.open(f).convert("RGB")`): a dataset decoded here gives the pixels a PyTorch pipeline
// sees.
//
// Contract:
// - Nothing here exits, prints or crashes on bad input: libjpeg and libpng report their errors
//   through longjmp into a frame that holds no C++ objects, and every error comes back as
//   INVALID_ARGUMENT whose message names the `name` given (a path, a tar member) and what was
//   wrong.
// - Corrupt and truncated data are errors, never a partly grey image: libjpeg's warnings that
//   mean damaged or missing entropy-coded data ("premature end of data segment", "premature end
//   of JPEG file", bad Huffman or arithmetic codes, lost sync, bogus progression) are errors;
//   the harmless ones (extraneous bytes before a marker, an unknown JFIF revision or Adobe
//   transform code, a bad ICC marker) are ignored, as PIL ignores them. libpng's warnings
//   (bad ancillary chunks, too much image data) are ignored.
// - Size: an image wider or taller than kMaxImageSide, or with more than kMaxImagePixels
//   pixels, is refused from its header, before any pixel memory is allocated.
// - Pixels are 8-bit, interleaved (HWC), rows top to bottom, no padding.
#ifndef STOKER_DATA_IMAGE_IMAGE_CODEC_H_
#define STOKER_DATA_IMAGE_IMAGE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

// Values are stored in index files: never renumber.
enum class ImageEncoding : uint8_t { kUnknown = 0, kJpeg = 1, kPng = 2 };

inline constexpr int kMaxImageSide = 65535;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

// From the magic bytes alone: JPEG starts FF D8 FF, PNG with its 8-byte signature. kUnknown for
// anything else (including fewer bytes than the magic).
ImageEncoding SniffImageEncoding(const uint8_t* data, size_t size);

struct ImageHeader {
  int width = 0;
  int height = 0;
  // As stored: 1 for grayscale (also grayscale with alpha), 3 for colour (RGB, RGBA, palette,
  // CMYK and YCCK JPEG).
  int channels = 0;
  ImageEncoding encoding = ImageEncoding::kUnknown;
};

// Parses only the header (JPEG: up to the first scan; PNG: the IHDR and the chunks before the
// image data). Checks the size bounds. INVALID_ARGUMENT naming `name` when the data is not a
// JPEG or PNG, is damaged, or is too large.
absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view name, const uint8_t* data,
                                            size_t size);

struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1 or 3
  std::vector<uint8_t> pixels;  // height * width * channels, HWC
};

// Decodes the whole image converted to `channels` (1 or 3) as PIL's convert("L") / convert("RGB")
// does after Image.open:
// - gray -> RGB replicates; RGB -> gray is ITU-R 601-2 luma in PIL's fixed point,
//   L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16;
// - alpha is dropped without compositing; palettes are expanded; 1, 2 and 4-bit gray scale to
//   0..255;
// - 16-bit PNG: colour and gray+alpha keep the high byte of each sample (PIL's "RGB;16B",
//   "RGBA;16B", "LA;16B" raw modes); 16-bit gray without alpha is PIL's mode "I", whose
//   conversion clips the value to 0..255 (so most 16-bit gray pixels become 255);
// - CMYK/YCCK JPEG: PIL assumes Adobe's inverted CMYK and converts with
//   nk = 255 - K, R = clip(nk - C * nk / 255) (rounded as PIL's MULDIV255).
// JPEG decoding is libjpeg-turbo's default (accurate integer IDCT, fancy upsampling), the same
// library and settings PIL uses, so pixels match PIL's exactly when both use this libjpeg-turbo.
absl::StatusOr<Image> DecodeImage(absl::string_view name, const uint8_t* data, size_t size,
                                  int channels);

// Encodes `image` (1 or 3 channels, pixels.size() == width * height * channels) as an 8-bit gray
// or RGB PNG (zlib default compression, no interlacing). INVALID_ARGUMENT for a malformed image.
absl::StatusOr<std::vector<uint8_t>> EncodePng(const Image& image);

// Chroma subsampling of a colour JPEG.
enum class JpegSampling { k420, k422, k444 };

// Encodes `image` (1 or 3 channels) as a baseline JFIF JPEG at `quality` (1..100), libjpeg's
// defaults otherwise (4:2:0 chroma subsampling for colour, as PIL's default, unless `sampling`).
absl::StatusOr<std::vector<uint8_t>> EncodeJpeg(const Image& image, int quality,
                                                JpegSampling sampling = JpegSampling::k420);

}  // namespace stoker

#endif  // STOKER_DATA_IMAGE_IMAGE_CODEC_H_
