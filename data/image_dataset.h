// Image datasets ("image_folder", "shards") as loaders and the trainer use them: an index of
// encoded images (data/index/sample_index.h) turned into samples by decoding and transforming
// each image (data/image/image_transform.h) into uint8 [channels, size, size].
//
// - Loaders: ImageBatchSource makes batch b of the job from EpochSampleOrder(seed, epoch)
//   [i*B, (i+1)*B) of the training index, reading each image with pread from its file (shards
//   with readahead advice for the batch's members), so a loader holds one batch of encoded bytes,
//   never the dataset. The random crop and flip of sample p of batch b are a pure function of
//   (seed, b, p): a batch is the same whichever loader makes it, and after a respawn. Rank r of a
//   data-parallel job of N gets SliceOfRank(count, B, r, N, i) of the epoch's order (which is the
//   same for every rank: for shards, the one shuffle-buffer stream), and p counts from the start
//   of the global batch, so the ranks' batches b together are one rank's batch b of N x B.
// - Bad samples: an image that cannot be read or decoded is skipped (the batch holds fewer
//   samples), counted in JobStats::bad_samples_total and named on the loader's log; once more
//   than max_bad_samples have been skipped (all loaders together), Make fails with
//   INVALID_ARGUMENT naming the ones it saw, which fails the job (its data is bad).
// - The trainer: WriteImageTestSplit decodes the test split with the evaluation transform, a
//   chunk of a few hundred images at a time, into a prepared samples file
//   (data/prepared_dataset.h) that the trainer maps: its memory is page cache, which the kernel
//   can reclaim, not the trainer's own (50,000 ImageNet images at 224 x 224 are 7.5 GB).
#ifndef STOKER_DATA_IMAGE_DATASET_H_
#define STOKER_DATA_IMAGE_DATASET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/dataset.h"
#include "data/decoded_cache.h"
#include "data/image/image_codec.h"
#include "data/image/image_transform.h"
#include "data/index/sample_index.h"
#include "data/job_region.h"
#include "data/jpeg_cache.h"
#include "data/loader.h"

namespace stoker {

// The training split's index, built from the job's path: a directory (image_folder) or a shard
// pattern (shards). `log` receives progress lines (the first and last class or shard, and one
// every 10 s between). `data_root` confines it (Confinement; "" = none): an image folder's entries
// that lead outside it through symbolic links are left out, the first ten named to `log` and all
// counted in a line at the end; a shard outside it is refused.
absl::StatusOr<SampleIndex> BuildImageIndex(const std::string& format, const std::string& path,
                                            const std::function<void(const std::string&)>& log,
                                            const std::string& data_root = "");

// What the server can learn about an image dataset at submit, cheaply (no index is built):
// image_folder: the class directories (sorted; INVALID_ARGUMENT when there are none or one holds
// no image within its first kMaxClassProbeEntries entries, NOT_FOUND when the root is missing) and
// the header of the first image file, if one reads (3 channels if any of the first 16 images, by
// class and name at each class's top level, is in colour, as FirstImageHeader decides); shards:
// that every shard the pattern names exists as a regular file (NOT_FOUND naming the first missing
// one and how many are), and their number. With `data_root`, what the index would leave out (an
// entry that leads outside it through a symbolic link) is left out here too, and a shard outside it
// is refused (INVALID_ARGUMENT); images are opened beneath it.
inline constexpr int kMaxClassProbeEntries = 10000;
struct ImageDatasetProbe {
  std::vector<std::string> class_names;  // image_folder
  std::optional<ImageHeader> first;      // image_folder, when the first image's header reads
  size_t shards = 0;                     // shards
};
absl::StatusOr<ImageDatasetProbe> ProbeImageDataset(const std::string& format,
                                                    const std::string& path,
                                                    const std::string& data_root = "");

// What decides a job's sample geometry when dataset.image leaves it open: the size of the first
// sample of `index` whose header can be read, and 3 channels if any of the first 16 readable
// images is in colour, else 1 (one grayscale image first in an RGB dataset does not make it a
// grayscale job). INVALID_ARGUMENT when none of the first 16 can be read.
absl::StatusOr<ImageHeader> FirstImageHeader(const SampleIndex& index);

// Reads sample `i`'s encoded bytes into `bytes`. `fds` caches open files (closed by the caller's
// FileCache destructor).
class FileCache {
 public:
  explicit FileCache(size_t capacity = 64) : capacity_(capacity) {}
  ~FileCache();
  FileCache(const FileCache&) = delete;
  FileCache& operator=(const FileCache&) = delete;
  // An open descriptor of `path` (source number `source`), or an error naming the path; opened
  // beneath `real_root` (OpenBeneath; empty: anywhere): PERMISSION_DENIED for a file that leads
  // outside it.
  absl::StatusOr<int> Get(uint32_t source, absl::string_view path,
                          absl::string_view real_root = "");

 private:
  size_t capacity_;
  std::vector<std::pair<uint32_t, int>> open_;  // oldest first
};
absl::Status ReadSampleBytes(const SampleIndex& index, int64_t i, FileCache& files,
                             std::vector<uint8_t>& bytes);

// Reads and decodes samples first .. first + n - 1 of `subset` (of the index itself when
// `subset` is empty) with the deterministic `transform` on `threads` threads: the j-th into
// out + j x TransformOutputBytes(transform), ok[j] = 1 when it decoded, else 0 (its pixels are
// unspecified) and `on_bad` (may be empty; called under a lock) gets the error naming it.
void DecodeInParallel(const SampleIndex& index, const ImageTransform& transform,
                      const std::vector<uint32_t>& subset, int64_t first, int64_t n, int threads,
                      uint8_t* out, uint8_t* ok,
                      const std::function<void(const absl::Status&)>& on_bad);

struct ImageSourceOptions {
  ImageTransform transform;  // the training transform, geometry resolved
  uint64_t seed = 0;
  int shuffle_buffer = 10000;  // shards
  int64_t limit = 0;           // > 0: only LimitedSubset(count, limit) of the index
  int64_t max_bad_samples = 100;
  // Data-parallel jobs: the loader feeds rank `rank` of `replicas` (see LoaderOptions); batches
  // per epoch count global batches.
  uint32_t rank = 0;
  uint32_t replicas = 1;
  // Shared by all loaders of the job (the region's JobStats::bad_samples_total, every skip, and
  // JobStats::bad_samples, the distinct samples the limit counts); null in tests and benchmarks
  // (then local ones are used).
  std::atomic<uint64_t>* bad_samples_total = nullptr;
  BadSampleSet* bad_samples = nullptr;
  // Receives "bad sample NAME: why" lines.
  std::function<void(const std::string&)> log;
  // The training split decoded once (decoded_cache.h), for a deterministic transform: a present
  // sample's pixels are copied from it instead of being read and decoded. May be null.
  std::shared_ptr<const DecodedCache> decoded_cache;
  // Image folders (not shards, whose JPEGs are restart-marked when packed): the worker's cache of
  // restart-indexed JPEGs (jpeg_cache.h) in this directory ("" = none), bounded to this many
  // bytes. A JPEG with a verified copy there is decoded from the copy (the same pixels; a crop
  // low in the image skips the rows above it); one without is decoded from the original, then
  // transcoded and stored. A cache that cannot be opened is named on `log` and not used; its
  // errors only ever send a sample back to its original file. `log` gets a line per epoch with
  // what the cache did ("jpeg cache, epoch 3: 1000 hits, ...") and one when the source is
  // destroyed.
  std::string jpeg_cache_dir;
  int64_t jpeg_cache_bytes = kDefaultJpegCacheBytes;
  absl::Duration jpeg_cache_touch_interval = absl::Minutes(10);  // JpegCacheOptions
};

class ImageBatchSource : public BatchSource {
 public:
  // INVALID_ARGUMENT when the transform is unusable, the index is empty or options.rank/replicas
  // fail CheckRank.
  static absl::StatusOr<std::unique_ptr<ImageBatchSource>> Create(SampleIndex index,
                                                                  uint32_t batch_size,
                                                                  ImageSourceOptions options);

  ~ImageBatchSource() override;

  int64_t count() const { return count_; }
  // What the JPEG cache did so far; null without one.
  const JpegCacheStats* jpeg_cache_stats() const {
    return jpeg_cache_ != nullptr ? &jpeg_cache_->stats() : nullptr;
  }
  int64_t batches_per_epoch() const override { return batches_per_epoch_; }
  SampleType sample_type() const override { return SampleType::kUint8; }
  int sample_bytes() const override { return static_cast<int>(sample_bytes_); }
  absl::StatusOr<uint32_t> Make(uint64_t batch, uint8_t* samples, uint8_t* labels) override;

 private:
  ImageBatchSource(SampleIndex index, uint32_t batch_size, ImageSourceOptions options);
  // Reads sample `sample` (through the JPEG cache when there is one) and decodes it into `out`.
  absl::Status ReadAndDecode(int64_t sample, uint64_t random_bits, uint8_t* out);
  // Logs what the JPEG cache did since the last line, if anything.
  void LogJpegCache(const std::string& when);

  SampleIndex index_;
  uint32_t batch_size_;
  ImageSourceOptions options_;
  int64_t count_;
  int64_t batches_per_epoch_;
  size_t sample_bytes_;
  std::vector<uint32_t> subset_;  // LimitedSubset(index_.count(), options_.limit)
  uint64_t cached_epoch_ = UINT64_MAX;
  std::vector<uint32_t> order_;
  FileCache files_;
  std::vector<uint8_t> bytes_;
  std::unique_ptr<TransformScratch> scratch_;
  std::atomic<uint64_t> local_bad_{0};
  std::unique_ptr<BadSampleSet> local_bad_samples_;
  std::vector<std::string> bad_names_;  // the first few this loader skipped, for the error
  std::unique_ptr<JpegCache> jpeg_cache_;
  JpegCacheStats jpeg_cache_logged_;  // the counters at the last line logged
};

// dataset.train_limit / test_limit on an image dataset: the index numbers of a fixed random
// subset of `limit` samples, in index order (empty when limit <= 0 or >= count). Not the first
// `limit`: an image folder's index is sorted by class, so those would be its first classes.
std::vector<uint32_t> LimitedSubset(int64_t count, int64_t limit);

// {channels, height, width} of the samples `transform` makes.
std::vector<int> ImageSampleDims(const ImageTransform& transform);

// The 64 random bits sample `position` of batch `batch` is transformed with.
uint64_t SampleRandomBits(uint64_t seed, uint64_t batch, uint32_t position);

// The test split of an image dataset, ready for evaluation, written chunk by chunk into the
// prepared samples file `path` (PreparedSamplesWriter: only one chunk of samples and the labels
// are in memory at once). LimitedSubset(count, limit) (all when 0) of the samples of `test` are
// decoded with `transform` (deterministic: no random crop or flip), in index order, on `threads`
// threads, in chunks of at most 512 samples (and about 64 MiB). Samples that cannot be decoded are
// skipped and named on `log`; more than `max_bad_samples` of them is an INVALID_ARGUMENT naming
// some (as soon as a chunk passes the limit); none decodable is INVALID_ARGUMENT. Labels are made
// the training set's: image folders' classes are matched by directory name, so a test folder may
// lack classes of the training folder, and a class the training folder does not have is
// INVALID_ARGUMENT naming it; shards' .cls numbers are labels already, and one not below `classes`
// (the job's class count) is OUT_OF_RANGE. The writer's errors are UNAVAILABLE naming `path`. On
// any error no file is left at `path` or beside it. Returns what was written (count: the samples
// kept; classes: `classes`).
absl::StatusOr<DatasetSummary> WriteImageTestSplit(
    const SampleIndex& train, const SampleIndex& test, const ImageTransform& transform, int classes,
    int64_t limit, int threads, int64_t max_bad_samples,
    const std::function<void(const std::string&)>& log, const std::string& path);

}  // namespace stoker

#endif  // STOKER_DATA_IMAGE_DATASET_H_
