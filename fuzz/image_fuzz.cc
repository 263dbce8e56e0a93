// libFuzzer target: arbitrary bytes through the image header reader, the full decoder (1 and 3
// channels) and the transforms (RandomResizedCrop + flip, Resize + CenterCrop, the size-0 copy).
// Errors must name the file; a decoded image must have the header's size. Full decodes are
// limited to 2^20 pixels so that a tiny input claiming a huge image does not spend the run
// zero-filling memory (the decoder's own bound, 2^28 pixels, is checked by image_test).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/image/image_codec.h"
#include "data/image/image_transform.h"

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
  return 0;
}
