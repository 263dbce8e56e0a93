// The index file's layout and the builder both index builders fill; internal to data/index.
//
//   offset 0                      IndexFileHeader (128 bytes)
//   128                           IndexedSample[sample_count]          (24 bytes each)
//   then                          SourceRecord[source_count]           (24 bytes each)
//   then                          uint32_t class_name[class_name_count], padded to 8 bytes
//   then                          strings (strings_bytes), NUL-terminated names; ends in NUL
//   file_bytes                    the end
//
// Every offset follows from the counts, so nothing in the file points anywhere by itself.
#ifndef STOKER_DATA_INDEX_INDEX_FORMAT_H_
#define STOKER_DATA_INDEX_INDEX_FORMAT_H_

#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/index/sample_index.h"

namespace stoker {

static_assert(std::endian::native == std::endian::little, "the index file is little-endian");

inline constexpr char kIndexMagic[8] = {'S', 'T', 'K', 'I', 'N', 'D', 'E', 'X'};
inline constexpr uint32_t kIndexVersion = 2;  // 2: the confinement root, entries left out
inline constexpr uint32_t kIndexKindImageFolder = 1;
inline constexpr uint32_t kIndexKindShards = 2;
// The string table is addressed with uint32 offsets.
inline constexpr uint64_t kMaxIndexStringBytes = UINT32_MAX;

struct IndexFileHeader {
  char magic[8];
  uint32_t version;
  uint32_t kind;
  uint64_t file_bytes;  // the whole file, header included
  uint64_t sample_count;
  uint32_t source_count;
  uint32_t classes;
  uint32_t class_name_count;  // classes (image folder) or 0 (shards)
  uint32_t body_crc32;        // zlib crc32 of bytes [sizeof(IndexFileHeader), file_bytes)
  uint64_t strings_bytes;
  uint64_t skipped;
  uint32_t sample_record_bytes;  // sizeof(IndexedSample)
  uint32_t source_record_bytes;  // sizeof(SourceRecord)
  uint32_t root;                 // string offset of the confinement root (root_set == 1)
  uint32_t root_set;             // 1: sources must stay beneath `root`; 0: no confinement
  uint64_t outside;              // entries left out because they lead outside the root
  uint8_t reserved[40];
};
static_assert(sizeof(IndexFileHeader) == 128);

struct SourceRecord {
  uint64_t file_bytes;    // the source file's length when indexed
  uint64_t first_sample;  // its samples are [first_sample, next source's first_sample)
  uint32_t path;          // offset of its absolute path in the string table
  uint32_t reserved;
};
static_assert(sizeof(SourceRecord) == 24);

// Where each section starts, from the counts (all within uint64 for counts below 2^32).
struct IndexLayout {
  uint64_t samples, sources, class_names, strings, end;
};
IndexLayout ComputeIndexLayout(uint64_t sample_count, uint64_t source_count,
                               uint64_t class_name_count, uint64_t strings_bytes);

// Collects an index in memory; Finish lays it out and validates it as OpenSampleIndex would.
class IndexBuilder {
 public:
  explicit IndexBuilder(bool sharded);

  // Adds a NUL-terminated copy of `text` (which must not contain NUL) and returns its offset.
  absl::StatusOr<uint32_t> AddString(absl::string_view text);
  // A source file; its first sample is the next one added.
  void AddSource(uint32_t path, uint64_t file_bytes);
  absl::Status AddSample(const IndexedSample& sample);
  void AddClassName(uint32_t name) { class_names_.push_back(name); }
  void AddSkipped(int64_t n) { skipped_ += n; }
  // The directory every source must stay beneath (its real path), kept in the index for the
  // readers' opens (FileCache).
  absl::Status SetRoot(absl::string_view real_root);
  void AddOutside(int64_t n) { outside_ += n; }

  int64_t sample_count() const { return static_cast<int64_t>(samples_.size()); }
  uint32_t source_count() const { return static_cast<uint32_t>(sources_.size()); }
  int64_t skipped() const { return skipped_; }
  uint64_t sample_bytes() const { return sample_bytes_; }

  // `classes` 0: the largest label + 1. `what` names the dataset in errors.
  absl::StatusOr<SampleIndex> Finish(int classes, const std::string& what);

 private:
  bool sharded_;
  std::vector<IndexedSample> samples_;
  std::vector<SourceRecord> sources_;
  std::vector<uint32_t> class_names_;
  std::string strings_;
  int64_t skipped_ = 0;
  int64_t outside_ = 0;
  std::optional<uint32_t> root_;
  uint64_t sample_bytes_ = 0;
  int max_label_ = -1;
};

// Builds SampleIndex objects from validated bytes.
class SampleIndexAccess {
 public:
  // Takes ownership of a file image (8-byte aligned) after validating it; `what` names it in
  // errors.
  static absl::StatusOr<SampleIndex> FromOwned(std::vector<uint64_t> words, uint64_t length,
                                               const std::string& what);
  // Maps `path` and validates it.
  static absl::StatusOr<SampleIndex> FromFile(const std::string& path);
  static const uint8_t* Bytes(const SampleIndex& index) { return index.bytes_; }
};

// Checks an index file image whole (see OpenSampleIndex). `what` names it in errors.
absl::Status ValidateIndexBytes(const uint8_t* bytes, uint64_t length, const std::string& what);

// The extension's encoding (kIndexedJpeg, kIndexedPng) for "jpg", "jpeg", "png" in any case, else
// 0.
uint8_t EncodingForExtension(absl::string_view extension);

// The encoding an image folder's file name names by its ending (torchvision:
// name.lower().endswith((".jpg", ".jpeg", ".png"))), else 0. The index and the submit-time probe
// (ProbeImageDataset) both count images by it.
uint8_t ImageEncodingOfName(absl::string_view name);

}  // namespace stoker

#endif  // STOKER_DATA_INDEX_INDEX_FORMAT_H_
