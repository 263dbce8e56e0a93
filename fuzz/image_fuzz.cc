// libFuzzer target: arbitrary bytes through the image header reader, the full decoder (1 and 3
// channels) and the transforms (RandomResizedCrop + flip, Resize + CenterCrop, the size-0 copy);
// a JPEG that transcodes to restart-indexed form (jpeg_restart.h) must give the same pixels as
// the original for a crop of its lower half (decoded from a slice of MCU rows), and the row index
// of any input must stay inside it.
// Errors must name the file; a decoded image must have the header's size. Full decodes are
// limited to 2^20 pixels so that a tiny input claiming a huge image does not spend the run
// zero-filling memory (the decoder's own bound, 2^28 pixels, is checked by image_test).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "data/image/image_codec.h"
#include "data/image/image_transform.h"
#include "data/image/jpeg_restart.h"

namespace {

void CheckError(const absl::Status& status) {
  if (status.ok()) return;
  if (status.message().find("fuzz.img") == absl::string_view::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes: ASan catches any read past the end.
  const std::vector<uint8_t> copy(data, data + size);
  absl::StatusOr<stoker::ImageHeader> header =
      stoker::ReadImageHeader("fuzz.img", copy.data(), size);
  CheckError(header.status());
  if (!header.ok()) {
    if (stoker::DecodeImage("fuzz.img", copy.data(), size, 3).ok()) std::abort();
    return 0;
  }
  if (header->width < 1 || header->height < 1 || header->width > stoker::kMaxImageSide ||
      header->height > stoker::kMaxImageSide) {
    std::abort();
  }
  if (static_cast<int64_t>(header->width) * header->height > (int64_t{1} << 20)) return 0;

  for (int channels : {1, 3}) {
    absl::StatusOr<stoker::Image> image =
        stoker::DecodeImage("fuzz.img", copy.data(), size, channels);
    CheckError(image.status());
    if (image.ok() &&
        (image->width != header->width || image->height != header->height ||
         image->pixels.size() != static_cast<size_t>(image->width) * image->height * channels)) {
      std::abort();
    }
  }

  static stoker::TransformScratch scratch;  // reused across inputs, as a loader does
  const uint64_t bits = size * 0x9e3779b97f4a7c15ULL;
  stoker::ImageTransform train;
  train.size = 5;  // small outputs, so that crops of the small seeds take the DCT-scaled path
  train.random_resized_crop = true;
  train.horizontal_flip = true;
  stoker::ImageTransform eval;
  eval.channels = 1;
  eval.size = 4;
  eval.resize = 5;
  stoker::ImageTransform train_wide = train;  // wider outputs: the vector passes' loops and tails
  train_wide.size = 37;
  train_wide.decode = stoker::ImageDecodeMode::kFast;  // JDCT_IFAST, plain upsampling
  stoker::ImageTransform copy_as_is;
  copy_as_is.expect_height = header->height;
  copy_as_is.expect_width = header->width;
  for (const stoker::ImageTransform* t : {&train, &train_wide, &eval, &copy_as_is}) {
    std::vector<uint8_t> out(stoker::TransformOutputBytes(*t));
    CheckError(
        stoker::DecodeTransformed("fuzz.img", copy.data(), size, *t, bits, out.data(), &scratch));
  }

  // The row index reads only inside the data (ASan), and its rows lie inside it, in order.
  if (std::optional<stoker::JpegRowIndex> index = stoker::IndexJpegRows(copy.data(), size)) {
    for (int r = 0; r < index->mcu_rows; ++r) {
      if (index->row_begin[r] > index->row_end[r] || index->row_end[r] > size) std::abort();
    }
  }
  // A transcodable JPEG: a crop of its lower half, from the original and from the restart-indexed
  // copy (decoded from a slice), must be the same pixels.
  if (header->encoding == stoker::ImageEncoding::kJpeg && header->height >= 4) {
    absl::StatusOr<std::vector<uint8_t>> marked =
        stoker::AddJpegRestartMarkers("fuzz.img", copy.data(), size);
    CheckError(marked.status());
    if (marked.ok()) {
      const int side = std::max(1, std::min(header->width, header->height) / 2);
      const stoker::CropBox box{header->height - side, (header->width - side) / 2, side, side};
      std::vector<uint8_t> a(3 * 3 * 3), b(a.size());
      const absl::Status first = stoker::DecodeCropResize("fuzz.img", copy.data(), size, 3, box, 3,
                                                          false, a.data(), &scratch);
      const absl::Status second = stoker::DecodeCropResize(
          "fuzz.img", marked->data(), marked->size(), 3, box, 3, false, b.data(), &scratch);
      CheckError(first);
      CheckError(second);
      if (first.ok() && second.ok() && a != b) std::abort();
    }
  }
  return 0;
}
