// Restart-indexed JPEGs: a lossless re-encoding with a restart marker after every MCU row, and
// the layout that lets a decoder start at any MCU row instead of Huffman-decoding every row above
// a crop (the decoder's limit on random crops of large images, docs/profile-jpeg.md).
//
// AddJpegRestartMarkers rewrites the entropy-coded data from the same quantized DCT coefficients
// (libjpeg's transcoding API, what `jpegtran -restart 1` does), so every decoder gives the same
// pixels for the new file as for the old. IndexJpegRows finds where each MCU row's bytes start
// (a scan for the restart markers); SliceJpegRows makes a small JPEG of MCU rows [first, last):
// the header with the height rewritten, those rows' bytes with their markers renumbered from
// RST0, EOI. Decoded, its rows equal the full image's rows there, except where the chroma
// upsampler reads the row above or below the slice (4:2:0): a caller keeps one MCU row of margin
// on each side (image_decoder.cc does).
#ifndef STOKER_DATA_IMAGE_JPEG_RESTART_H_
#define STOKER_DATA_IMAGE_JPEG_RESTART_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

// The JPEG re-encoded with a restart interval of one MCU row, nothing else changed (markers
// other than the JFIF/Adobe ones libjpeg writes are dropped: EXIF, ICC and comments do not change
// PIL's pixels). INVALID_ARGUMENT naming `name` for data that is not a sequential Huffman JPEG
// (progressive, arithmetic-coded and lossless JPEGs are left as they are by callers) or is
// damaged.
absl::StatusOr<std::vector<uint8_t>> AddJpegRestartMarkers(absl::string_view name,
                                                           const uint8_t* data, size_t size);

// Where each MCU row of a JPEG with one restart interval per MCU row lies.
struct JpegRowIndex {
  int width = 0;
  int height = 0;
  int mcu_height = 0;             // pixel rows per MCU row: 8 x the largest vertical sampling
  int mcu_rows = 0;               // ceil(height / mcu_height)
  size_t sof_height_offset = 0;   // the frame header's 2-byte height
  size_t entropy_begin = 0;       // the first byte after the scan header
  std::vector<size_t> row_begin;  // row r's entropy-coded bytes are [row_begin[r], row_end[r])
  std::vector<size_t> row_end;    // (the restart marker after it excluded)
};

// The index, or nothing when the JPEG has no restart interval of exactly one MCU row, more than
// one scan, is not sequential Huffman, or its markers are not where they should be (then decode
// it whole, as any JPEG).
std::optional<JpegRowIndex> IndexJpegRows(const uint8_t* data, size_t size);

// Replaces `out` with a JPEG of MCU rows [first, last) of the indexed image
// (0 <= first < last <= index.mcu_rows).
void SliceJpegRows(const uint8_t* data, const JpegRowIndex& index, int first, int last,
                   std::vector<uint8_t>* out);

}  // namespace stoker

#endif  // STOKER_DATA_IMAGE_JPEG_RESTART_H_
