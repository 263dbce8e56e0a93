// Sample indexes of image datasets: where each encoded image of an image folder or of a set of
// WebDataset tar shards lives (file, byte offset, length), its label, and the order of an epoch.
//
// The agent builds an index once per job (BuildImageFolderIndex / BuildShardIndex) and writes it
// into the job's directory (WriteSampleIndex); every loader process maps it read-only
// (OpenSampleIndex), so K loaders share one copy in the page cache and their own memory does not
// grow with the dataset. A loader then preads sample i's bytes from source_path(sample(i).source)
// at [offset, offset + size) and decodes them (data/image).
//
// The index file (host byte order, little-endian only): a 128-byte header (magic "STKINDEX",
// version, kind, counts, the file's length and a CRC-32 of everything after the header), then the
// samples (IndexedSample[count]), the sources (path, length in bytes, first sample), the class
// names (folders only) and a string table of NUL-terminated names. OpenSampleIndex checks all of
// it before the first access: a truncated, extended or corrupt file is an error, never a crash.
// The file is replaced by rename only, so a mapped index never shrinks under a reader.
#ifndef STOKER_DATA_INDEX_SAMPLE_INDEX_H_
#define STOKER_DATA_INDEX_SAMPLE_INDEX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

// The values of IndexedSample::encoding; they are ImageEncoding's (data/image/image_codec.h).
inline constexpr uint8_t kIndexedJpeg = 1;
inline constexpr uint8_t kIndexedPng = 2;

// One sample, stored as is in the index file.
struct IndexedSample {
  uint64_t offset;  // where the encoded image starts in its source file
  uint32_t size;    // its length in bytes
  uint32_t source;  // which source file (image file, or shard)
  uint32_t name;    // offset of its name in the string table (for error messages)
  uint8_t label;
  uint8_t encoding;  // ImageEncoding, from the file or member name's extension
  uint8_t reserved[2];
};
static_assert(sizeof(IndexedSample) == 24, "IndexedSample is part of the index file format");

// Most samples an index holds (sample numbers are uint32 in EpochSampleOrder).
inline constexpr int64_t kMaxIndexSamples = UINT32_MAX;
// Most classes: labels are uint8.
inline constexpr int kMaxIndexClasses = 256;
// Most shards a pattern may name.
inline constexpr size_t kMaxShards = size_t{1} << 20;

class SampleIndex {
 public:
  SampleIndex(SampleIndex&& other) noexcept;
  SampleIndex& operator=(SampleIndex&& other) noexcept;
  SampleIndex(const SampleIndex&) = delete;
  SampleIndex& operator=(const SampleIndex&) = delete;
  ~SampleIndex();

  // True for tar shards, false for an image folder.
  bool sharded() const;
  int64_t count() const;
  // Requires 0 <= i < count().
  const IndexedSample& sample(int64_t i) const;
  // Absolute path of an image file (image folder) or a shard. Requires source < source_count().
  absl::string_view source_path(uint32_t source) const;
  // Length of that file when the index was built; every sample of it lies within it.
  uint64_t source_bytes(uint32_t source) const;
  // Image folder: one source per sample, source i holds sample i. Shards: one per shard, in the
  // pattern's order.
  uint32_t source_count() const;
  // The samples of source s are [shard_begin(s), shard_begin(s + 1)) in index order, for
  // 0 <= s <= source_count() (shard_begin(source_count()) == count()).
  int64_t shard_begin(uint32_t s) const;
  // Image folder: the number of class directories. Shards: max(label) + 1.
  int classes() const;
  // Image folder: the class directories' names, sorted (label k is class_names()[k]). Shards:
  // empty.
  std::vector<std::string> class_names() const;
  // "ROOT/CLASS/x.jpg" (the file's absolute path) or "/abs/shard.tar:KEY.jpg" (shard and member).
  std::string SampleName(int64_t i) const;
  // Entries that were not samples. Image folder: files in the class directories whose name does
  // not end in .jpg, .jpeg or .png (any case). Shards: regular members whose extension is none of
  // jpg, jpeg, png and cls (e.g. KEY.json), and members without an extension.
  int64_t skipped() const;
  // Entries left out because they lead outside the confinement root (Confinement).
  int64_t outside() const;
  // The real path of the directory every source must stay beneath ("" = none): readers open
  // through OpenBeneath with it (FileCache), so a file swapped for a link after indexing is still
  // refused.
  absl::string_view root() const;
  // Length of the index in bytes (as written by WriteSampleIndex).
  uint64_t index_bytes() const;

 private:
  friend class SampleIndexAccess;
  SampleIndex();

  // Points the accessors into a validated file image.
  void Attach(const uint8_t* bytes, uint64_t length);

  std::vector<uint64_t> owned_;  // a built index: the file's bytes, 8-byte aligned
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;  // an opened index: the mapped file
  const uint8_t* bytes_ = nullptr;    // the file image (owned_ or mapping_)
  uint64_t length_ = 0;
  const IndexedSample* samples_ = nullptr;
  const uint8_t* sources_ = nullptr;  // SourceRecord[source_count] (data/index/index_format.h)
  const uint32_t* class_names_ = nullptr;
  const char* strings_ = nullptr;
};

// Reported after each class directory or shard, so that a caller can log and heartbeat.
struct IndexProgress {
  std::string path;     // the class directory or shard just indexed
  int64_t done = 0;     // class directories or shards indexed so far
  int64_t total = 0;    // class directories or shards in all
  int64_t samples = 0;  // samples found so far
  int64_t skipped = 0;  // entries skipped so far (SampleIndex::skipped)
  uint64_t bytes = 0;   // encoded bytes of the samples found so far
};
using ProgressFn = std::function<void(const IndexProgress&)>;  // may be empty

// Where an index's files must stay (the job's data root; data/index/beneath.h). Image folders:
// an entry that leads outside the root through a symbolic link (a class directory, a directory
// within a class, an image) is left out, counted (SampleIndex::outside) and named to `left_out`;
// links that stay beneath the root are followed as before. Shards, which a job names one by one:
// a shard outside the root is refused (INVALID_ARGUMENT naming it as the pattern gave it). The
// root is kept in the index for the readers' opens.
struct Confinement {
  std::string real_root;  // RealRoot(data root); "" = no confinement
  std::function<void(const std::string& path)> left_out;  // may be empty
};

// torchvision's ImageFolder: classes are the subdirectories of `root` (symbolic links followed)
// sorted bytewise (Python's sorted() on UTF-8 names), label k for the k-th; the samples of a class
// are the .jpg/.jpeg/.png files (case-insensitive) found by walking its directory recursively,
// following links, in the order of torchvision's make_dataset: directories sorted by their whole
// path, each one's files sorted by name. Other files are skipped and counted; files directly in
// `root` are ignored. Image files are only stat()ed, never read: an unreadable or corrupt image is
// the decoder's bad sample. Errors name the path: `root` missing (NOT_FOUND) or not a directory,
// no class directory, more than 256 classes, a class without images, a directory that cannot be
// read, an image name that is not a regular file (a FIFO, a broken link) or is 4 GiB or more, and
// a directory reached twice through symbolic links (a loop; torchvision would walk it forever or
// list its files twice), all INVALID_ARGUMENT unless said otherwise.
absl::StatusOr<SampleIndex> BuildImageFolderIndex(const std::string& root,
                                                  const ProgressFn& progress,
                                                  const Confinement& confinement = {});

// WebDataset tar shards named by `pattern` (a path or a brace pattern, data/index/brace.h; relative
// paths are taken from the working directory). A sample is a member KEY.jpg, KEY.jpeg or KEY.png
// with a member KEY.cls holding its class (decimal, 0..255, surrounding whitespace allowed), where
// KEY is the member's path up to the first '.' of its base name and the extension (the rest) is
// compared lowercased. Members of one key must be consecutive, as WebDataset writes them. Members
// with other extensions, members without one and non-regular members without an image or cls
// extension are skipped. Samples are in shard order, then member order.
//
// Errors name the shard, and the key or byte offset: NOT_FOUND for the first missing shard (with
// how many of the pattern's names are missing); INVALID_ARGUMENT for a shard that is not a
// regular file, is compressed (gzip, bzip2, xz, zstd, lz4: shards must be uncompressed .tar for
// random access), is empty or not a tar archive (ustar, pax and GNU are read), is damaged or
// truncated; for a key with an image and no cls or a cls and no image, two images or two cls for
// one key, members of a key that are not consecutive, a cls that is not a number in 0..255, an
// image or cls member that is not a regular file with its bytes in place (a link, a sparse file),
// an image of 4 GiB or more; and for a pattern without any sample.
//
// Member headers are read with libarchive (tar formats only, no filters); data is skipped by
// seeking, never read, except the few bytes of each .cls member. The data offset of a member is
// what libarchive has consumed once it returns the member's header (archive_filter_bytes(a, 0)),
// which index_test checks against Python's TarInfo.offset_data for all three formats with long
// names; each offset is also checked to lie past its header on a 512-byte block and within the
// file.
absl::StatusOr<SampleIndex> BuildShardIndex(const std::string& pattern, const ProgressFn& progress,
                                            const Confinement& confinement = {});

// Writes `index` to `path` atomically: a temporary file beside it, fsync, then rename. Errors name
// the file.
absl::Status WriteSampleIndex(const SampleIndex& index, const std::string& path);

// Maps an index file read-only (PROT_READ, MAP_SHARED) and validates it whole: magic, version,
// layout against the file's length, the CRC, and every record (sources' paths and sample ranges,
// each sample's source, name, label, encoding, and offset + size within its source's length).
// Errors name the file and the byte offset or record at fault: DATA_LOSS for a damaged,
// truncated or extended file or another version, NOT_FOUND for a missing one, INVALID_ARGUMENT
// for one that is not a regular file, INTERNAL when it cannot be read or mapped. The mapping is
// valid as long as the file is only ever replaced by rename (WriteSampleIndex), never truncated
// in place (a truncated mapped file would fault on access).
absl::StatusOr<SampleIndex> OpenSampleIndex(const std::string& path);

// The order of one epoch, a permutation of [0, count()); a pure function of (index, seed, epoch,
// shuffle_buffer).
//   Image folder: EpochPermutation(count, seed, epoch) (data/dataset.h); shuffle_buffer is unused.
//   Shards: the shards are visited in the order EpochPermutation(source_count, seed, epoch), each
//   one's samples in index order, and that stream passes through a buffer of shuffle_buffer
//   sample numbers (values below 1 count as 1): the first shuffle_buffer fill it, then each next
//   one replaces a uniformly chosen buffered one, which is emitted; at the end the buffer is
//   emitted in random order. WebDataset's scheme: buffer 1 keeps the shuffled shard stream, a
//   buffer of count() or more is a uniform shuffle, and a sample leaves no earlier than
//   shuffle_buffer places before its place in the stream, and on average near that place (it
//   stays in the buffer a geometric number of steps of mean shuffle_buffer).
std::vector<uint32_t> EpochSampleOrder(const SampleIndex& index, uint64_t seed, uint64_t epoch,
                                       int shuffle_buffer);

}  // namespace stoker

#endif  // STOKER_DATA_INDEX_SAMPLE_INDEX_H_
