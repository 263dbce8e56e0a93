// The prepared training set: the agent decodes a job's training split once per attempt into one
// file in the attempt's directory, and every loader process maps that file read-only (PROT_READ,
// MAP_SHARED). The samples are then page cache shared by all loaders, not K private copies.
//
// Where the samples file already holds the samples as the ring wants them (a raw, not gzipped,
// IDX file; an NPY file, which is never compressed), the prepared file holds only the header and
// the labels and refers to the samples in that file, which loaders map in place: no copy is
// written (PrepareOptions::map_raw_sources). Gzipped IDX and CSV are decoded and their samples
// copied into the prepared file. Measured (Intel Xeon, 2 cores, warm page cache): a 1 GiB uint8
// NPY (350000 x 3 x 32 x 32) prepares in 5-22 ms in place against 2.6-3.3 s copied, which also
// writes 1 GiB more to the work directory and holds the whole array in the agent's memory while
// it does; Fashion-MNIST as raw IDX (45 MiB) in 2-18 ms against 0.11-0.13 s (0.49 s from the
// gzipped files, which must be decoded). A loader's first pass over the samples costs the same
// either way (the same page cache). The price of mapping in place: a dataset file changed while
// the job runs is read as it is then; a loader that starts later refuses it (its size or time
// differ from those recorded), and one that reads past a truncation gets SIGBUS, which
// stoker-loader reports as such.
//
// The trainer keeps an image dataset's decoded test split in the same format
// (PreparedSamplesWriter, written a chunk at a time), mapped: page cache, not its own memory.
//
// Layout of a prepared samples file (integers little-endian), version 1:
//   0   8 bytes   magic "STOKSMPL"
//   8   u32       version (1)
//   12  u32       header_bytes: 88 + 4 * rank + source_path_bytes
//   16  u32       CRC-32 (zlib's) of the header's header_bytes bytes with these 4 bytes zero
//   20  u32       sample type (SampleType: 0 uint8, 1 float32)
//   24  u64       count (1 .. 2^32 - 1)
//   32  u32       classes (1 .. 256; every label is below it)
//   36  u32       sample_bytes (product(dims) * the type's size)
//   40  u64       labels_offset: count label bytes in this file, after the header
//   48  u64       samples_offset: count * sample_bytes sample bytes, in this file (a multiple of
//                 4096, after the labels) or in the source file
//   56  u64       file_bytes: this file's size
//   64  u64       source_bytes: the source file's size when it holds the samples, else 0
//   72  i64       source_mtime_ns: its modification time (nanoseconds since the epoch)
//   80  u32       rank of a sample (1 .. 16)
//   84  u32       source_path_bytes (0 = the samples are in this file; at most 4096)
//   88  u32[rank] sample dims
//   ..  bytes     source path (no terminator)
// A file is written under a temporary name in the same directory and renamed into place, so a
// file under its final name is complete.
#ifndef STOKER_DATA_PREPARED_DATASET_H_
#define STOKER_DATA_PREPARED_DATASET_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/dataset.h"

namespace stoker {

// The first 8 bytes of a prepared samples file.
inline constexpr char kPreparedSamplesMagic[8] = {'S', 'T', 'O', 'K', 'S', 'M', 'P', 'L'};
inline constexpr uint32_t kPreparedSamplesVersion = 1;

struct PrepareOptions {
  // Refer to the samples of a raw IDX or NPY file instead of copying them (see above).
  bool map_raw_sources = true;
};

// Where PrepareTrainingSet puts a dataset's samples.
enum class SamplesStorage {
  kCopy,    // decoded (LoadDataset) and written into the prepared file
  kSource,  // left in the dataset's samples file, which loaders map in place
};

// kSource for a raw IDX samples file (its first bytes are not the gzip magic) and for NPY, when
// `options` allow it; else kCopy. Fails only when the samples file cannot be read.
absl::StatusOr<SamplesStorage> ChooseSamplesStorage(const DatasetFiles& files,
                                                    const PrepareOptions& options = {});

struct PreparedInfo {
  DatasetSummary summary;  // of the samples kept (after `limit`)
  SamplesStorage storage = SamplesStorage::kCopy;
  uint64_t file_bytes = 0;  // of the prepared file
};

// Reads and checks the training split `files` (as LoadDataset does, with the same errors, naming
// the dataset's files) and writes the prepared file `path`: a temporary file in the same
// directory, renamed to `path` once complete. `limit` > 0 keeps the first `limit` samples. An
// error writing it (a full disk) is UNAVAILABLE (the dataset is not at fault: another worker may
// succeed); it names `path` and the reason, says how far it got, and leaves no file behind.
absl::StatusOr<PreparedInfo> PrepareTrainingSet(const DatasetFiles& files, int64_t limit,
                                                const std::string& path,
                                                const PrepareOptions& options = {});

// Writes `data` (count >= 1, classes 1..256 and above every label, 1..16 dims) as a prepared file
// holding its samples, as PrepareTrainingSet does for kCopy.
absl::Status WritePreparedSamples(const SamplesView& data, const std::string& path);

// Writes a prepared file holding its samples chunk by chunk, for a split decoded in pieces whose
// final count is known only at the end (bad samples are skipped): Begin reserves label space for
// `max_count` samples, so the samples start at a fixed offset and each Append writes its chunk
// there in order; only the labels (1 byte per sample) are held in memory, until Finish writes
// them and the header with the real count, and renames the temporary file (in the same
// directory) to `path`. Errors are those of PrepareTrainingSet: INVALID_ARGUMENT for what the
// format cannot hold (count 0 or above max_count, dims, classes, a label not below `classes`),
// UNAVAILABLE naming `path` for a failed write (a full disk). Any error, and destruction before
// Finish, leave no file behind; after an error every later call returns it again.
class PreparedSamplesWriter {
 public:
  static absl::StatusOr<std::unique_ptr<PreparedSamplesWriter>> Begin(
      const std::string& path, int64_t max_count, SampleType sample_type,
      const std::vector<int>& sample_dims, int classes);
  ~PreparedSamplesWriter();
  PreparedSamplesWriter(const PreparedSamplesWriter&) = delete;
  PreparedSamplesWriter& operator=(const PreparedSamplesWriter&) = delete;

  // Appends `count` samples (count * sample_bytes bytes) and their labels.
  absl::Status Append(const uint8_t* samples, const uint8_t* labels, int64_t count);
  // Completes the file; returns its size.
  absl::StatusOr<uint64_t> Finish();

  int64_t count() const { return static_cast<int64_t>(labels_.size()); }
  int sample_bytes() const { return sample_bytes_; }

 private:
  class File;
  PreparedSamplesWriter() = default;
  absl::Status WriteError();

  std::string path_;
  std::unique_ptr<File> file_;
  int64_t max_count_ = 0;
  SampleType sample_type_ = SampleType::kUint8;
  std::vector<int> sample_dims_;
  int classes_ = 0;
  int sample_bytes_ = 0;
  uint64_t samples_offset_ = 0;
  std::vector<uint8_t> labels_;
  absl::Status status_;
  bool finished_ = false;
};

// What a prepared samples file's header says, checked (see ParsePreparedSamples).
struct PreparedLayout : SamplesShape {
  uint64_t labels_offset = 0;
  uint64_t samples_offset = 0;  // in this file, or in source_path
  uint64_t file_bytes = 0;
  std::string source_path;  // empty: the samples are in this file
  uint64_t source_bytes = 0;
  int64_t source_mtime_ns = 0;
};

// Parses and checks the prepared samples file whose `size` bytes are at `bytes` (`name` is used
// in errors, with the byte offset of the problem): magic, version, header checksum, a known sample
// type, dims that give sample_bytes, offsets and lengths that lie inside the file and match its
// size, and every label below `classes`. DATA_LOSS when it is truncated or corrupt,
// FAILED_PRECONDITION for another version (an agent and loader from different builds). Reads no
// byte outside [bytes, bytes + size).
absl::StatusOr<PreparedLayout> ParsePreparedSamples(const std::string& name, const uint8_t* bytes,
                                                    size_t size);

// A prepared samples file mapped read-only and shared (and, where it refers to its source, the
// source's samples, after checking that the source's size and modification time are still the
// recorded ones: else FAILED_PRECONDITION naming both files). Unmapped on destruction.
class MappedSamples {
 public:
  static absl::StatusOr<std::unique_ptr<MappedSamples>> Open(const std::string& path);
  ~MappedSamples();
  MappedSamples(const MappedSamples&) = delete;
  MappedSamples& operator=(const MappedSamples&) = delete;

  const SamplesView& view() const { return view_; }
  const PreparedLayout& layout() const { return layout_; }
  // The file whose pages hold the samples: the prepared file, or its source.
  const std::string& samples_path() const { return samples_path_; }

 private:
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
  };
  MappedSamples() = default;

  std::vector<Mapping> mappings_;
  PreparedLayout layout_;
  SamplesView view_;
  std::string samples_path_;
};

}  // namespace stoker

#endif  // STOKER_DATA_PREPARED_DATASET_H_
