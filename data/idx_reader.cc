// IDX files (the format MNIST and Fashion-MNIST ship in), raw or gzipped.
//
// Layout: two zero bytes, a type byte (0x08 = unsigned byte), a dimension count n, then n
// big-endian uint32 dimensions, then product(dims) elements. Offsets in errors count bytes of
// the IDX stream (after decompression for gzipped files).
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "data/dataset_internal.h"
#include "data/file_bytes.h"

namespace stoker {
namespace {

constexpr uint8_t kIdxUnsignedByte = 0x08;
constexpr uint64_t kMaxIdxBytes = kMaxDatasetFileBytes;

uint32_t BigEndian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

absl::StatusOr<IdxArray> ParseIdx(const std::string& path, std::vector<uint8_t> bytes) {
  if (bytes.size() < 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: expected a 4-byte IDX magic at offset 0, got ",
                     bytes.size(), " bytes"));
  }
  const uint32_t magic = BigEndian32(bytes.data());
  if (bytes[0] != 0 || bytes[1] != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: bad IDX magic 0x%08x at offset 0: expected 0x000008NN (not an IDX file?)", path,
        magic));
  }
  if (bytes[2] != kIdxUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported IDX element type 0x%02x at offset 2 (magic 0x%08x): only unsigned "
        "byte (0x08) is supported",
        path, bytes[2], magic));
  }
  const int rank = bytes[3];
  if (rank == 0) {
    return absl::DataLossError(
        absl::StrFormat("%s: IDX magic 0x%08x at offset 0 declares 0 dimensions", path, magic));
  }
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: expected ", header_bytes,
                                            " header bytes for ", rank, " dimensions, got ",
                                            bytes.size()));
  }
  IdxArray array;
  uint64_t elements = 1;
  for (int d = 0; d < rank; ++d) {
    const size_t offset = 4 + 4 * static_cast<size_t>(d);
    const uint32_t dim = BigEndian32(bytes.data() + offset);
    if (dim > static_cast<uint32_t>(INT_MAX)) {
      return absl::DataLossError(
          absl::StrCat(path, ": dimension ", d, " is ", dim, " at offset ", offset, ": too large"));
    }
    array.dims.push_back(static_cast<int>(dim));
    elements *= dim;
    if (elements > kMaxIdxBytes) {
      return absl::DataLossError(absl::StrCat(path, ": dimensions up to offset ", offset,
                                              " describe more than ", kMaxIdxBytes, " bytes"));
    }
  }
  const uint64_t data_bytes = bytes.size() - header_bytes;
  if (data_bytes != elements) {
    return absl::DataLossError(absl::StrCat(
        path, data_bytes < elements ? ": truncated" : ": unexpected trailing data", ": expected ",
        elements, " data bytes after offset ", header_bytes, ", got ", data_bytes));
  }
  // Drop the header in place rather than copying the (possibly 50 MB) payload.
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header_bytes));
  array.data = std::move(bytes);
  return array;
}

}  // namespace

absl::StatusOr<IdxArray> ParseIdxBytes(const std::string& name, std::vector<uint8_t> bytes) {
  STOKER_ASSIGN_OR_RETURN(std::vector<uint8_t> plain, MaybeGunzip(name, std::move(bytes)));
  return ParseIdx(name, std::move(plain));
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  STOKER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  return ParseIdxBytes(path, std::move(bytes));
}

absl::StatusOr<std::vector<int>> ReadIdxHeaderDims(const std::string& path) {
  // gzread reads raw files transparently, so one path serves both.
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  struct Closer {
    gzFile file;
    ~Closer() { gzclose(file); }
  } closer{file};
  uint8_t magic[4];
  if (gzread(file, magic, 4) != 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: expected a 4-byte IDX magic at offset 0"));
  }
  const uint32_t magic_word = BigEndian32(magic);
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: bad IDX magic 0x%08x at offset 0: expected 0x000008NN (not an IDX file?)", path,
        magic_word));
  }
  if (magic[2] != kIdxUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported IDX element type 0x%02x at offset 2: only unsigned byte (0x08) is "
        "supported",
        path, magic[2]));
  }
  if (magic[3] == 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": IDX header at offset 0 declares 0 dimensions"));
  }
  std::vector<int> dims;
  uint64_t elements = 1;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t b[4];
    const size_t offset = 4 + 4 * static_cast<size_t>(d);
    if (gzread(file, b, 4) != 4) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated IDX header: dimension ", d, " at offset ", offset));
    }
    const uint32_t dim = BigEndian32(b);
    if (dim > static_cast<uint32_t>(INT_MAX)) {
      return absl::DataLossError(
          absl::StrCat(path, ": dimension ", d, " is ", dim, " at offset ", offset, ": too large"));
    }
    dims.push_back(static_cast<int>(dim));
    elements = std::min<uint64_t>(elements * dim, kMaxIdxBytes + 1);
  }
  if (elements > kMaxIdxBytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": IDX dimensions describe more than ", kMaxIdxBytes, " bytes"));
  }
  if (gzdirect(file)) {  // raw: the size is known without reading the data
    const uint64_t header_bytes = 4 + 4 * dims.size();
    struct stat st;
    if (stat(path.c_str(), &st) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": stat"));
    const uint64_t data_bytes = static_cast<uint64_t>(st.st_size) - header_bytes;
    if (data_bytes != elements) {
      return absl::DataLossError(absl::StrCat(
          path, data_bytes < elements ? ": truncated" : ": unexpected trailing data", ": expected ",
          elements, " data bytes after offset ", header_bytes, ", got ", data_bytes));
    }
  }
  return dims;
}

absl::StatusOr<LabeledSamples> LoadIdxDataset(const std::string& images_path,
                                              const std::string& labels_path, int64_t limit) {
  STOKER_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  STOKER_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (images.dims.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": images file has ", images.dims.size(),
                     " dimension(s); expected a count followed by sample dimensions"));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": labels file has ",
                                                   labels.dims.size(),
                                                   " dimensions; expected 1 (magic 0x00000801)"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample count mismatch: ", images_path, " holds ", images.dims[0],
                     " images but ", labels_path, " holds ", labels.dims[0], " labels"));
  }
  LabeledSamples out;
  out.count = images.dims[0];
  out.sample_type = SampleType::kUint8;
  out.sample_dims.assign(images.dims.begin() + 1, images.dims.end());
  STOKER_ASSIGN_OR_RETURN(int features, FeatureCount(images_path, out.sample_dims, 1));
  out.features = features;
  out.sample_bytes = features;
  if (limit > 0 && limit < out.count) out.count = limit;
  images.data.resize(static_cast<size_t>(out.count) * static_cast<size_t>(out.sample_bytes));
  labels.data.resize(static_cast<size_t>(out.count));
  out.samples = std::move(images.data);
  out.labels = std::move(labels.data);
  STOKER_RETURN_IF_ERROR(FinishLabeledSamples(images_path, out));
  return out;
}

}  // namespace stoker
