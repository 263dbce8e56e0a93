#include "worker/dataset_probe.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/dataset.h"

namespace stoker {

absl::StatusOr<std::vector<int>> ReadIdxDims(const std::string& path) {
  // gzread reads raw files transparently, so one path serves both.
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  unsigned char magic[4];
  std::vector<int> dims;
  absl::Status status;
  if (gzread(file, magic, 4) != 4) {
    status = absl::InvalidArgumentError(absl::StrCat(path, ": offset 0: shorter than an IDX header"));
  } else if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4) {
    status = absl::InvalidArgumentError(absl::StrFormat(
        "%s: offset 0: bad IDX magic %02x%02x%02x%02x (expected 000008 then 1-4 dimensions)", path,
        magic[0], magic[1], magic[2], magic[3]));
  } else {
    for (int i = 0; i < magic[3] && status.ok(); ++i) {
      unsigned char b[4];
      if (gzread(file, b, 4) != 4) {
        status = absl::InvalidArgumentError(
            absl::StrCat(path, ": offset ", 4 + 4 * i, ": truncated IDX header"));
      } else {
        dims.push_back(static_cast<int>((uint32_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3]));
      }
    }
  }
  gzclose(file);
  if (!status.ok()) return status;
  return dims;
}

absl::StatusOr<DatasetShape> ProbeDataset(const v1::JobSpec& spec) {
  const v1::DatasetSpec& data = spec.dataset();
  absl::StatusOr<std::vector<int>> image_dims = ReadIdxDims(data.train_images());
  if (!image_dims.ok()) return image_dims.status();
  if (image_dims->size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(data.train_images(), ": expected images with at least 2 dimensions"));
  }
  // Labels are small: read them whole to count the classes.
  absl::StatusOr<IdxArray> labels = ReadIdxFile(data.train_labels());
  if (!labels.ok()) return labels.status();
  if (labels->dims.size() != 1 || labels->dims[0] != (*image_dims)[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.train_labels(), ": holds ", labels->dims.empty() ? 0 : labels->dims[0],
        " labels but ", data.train_images(), " holds ", (*image_dims)[0], " images"));
  }
  DatasetShape shape;
  shape.train_count = (*image_dims)[0];
  if (data.train_limit() > 0) shape.train_count = std::min<int64_t>(shape.train_count, data.train_limit());
  shape.sample_bytes = 1;
  for (size_t i = 1; i < image_dims->size(); ++i) shape.sample_bytes *= (*image_dims)[i];
  if (shape.train_count <= 0 || shape.sample_bytes <= 0 || shape.sample_bytes > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(data.train_images(), ": empty or implausible shape"));
  }
  const uint8_t max_label = *std::max_element(labels->data.begin(), labels->data.end());
  shape.classes = std::max(2, max_label + 1);
  return shape;
}

}  // namespace stoker
