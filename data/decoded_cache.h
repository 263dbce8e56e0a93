// The decoded cache of an image dataset's training split (dataset.decoded_cache: auto).
//
// When the training transform has no random step (no RandomResizedCrop, no flip), every epoch
// decodes every image into the same pixels. The agent then decodes them once per attempt, on the
// job's cores, into a file in the attempt's directory; the loaders map it read-only (page cache,
// shared by all of them, not their own memory) and copy a sample's pixels instead of reading and
// decoding its file. The batch stream is unchanged: the loaders still walk the index's epoch order
// (EpochSampleOrder, rank slices), only where a sample's pixels come from differs.
//
// A sample that could not be decoded (or lies outside dataset.train_limit's subset) is marked
// absent; the loaders decode it from its file as without the cache, so a bad image is named,
// counted and judged against max_bad_samples exactly as before.
//
// File layout (little-endian): "STOKDCAC", u32 version (1), u32 sample_bytes, u64 count (the
// index's samples), u64 index_bytes (the index's size, to tie the cache to its index), then
// `count` presence bytes (1 = decoded), then, from the next 4096-byte boundary, count x
// sample_bytes pixels (absent samples are zeros). It is written to a temporary file beside `path`
// and renamed once complete: a killed writer leaves no cache, only a temporary the attempt's end
// removes.
#ifndef STOKER_DATA_DECODED_CACHE_H_
#define STOKER_DATA_DECODED_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/image/image_transform.h"
#include "data/index/sample_index.h"

namespace stoker {

// Where the agent puts the cache of the training index at `index_path`, and the loaders look.
std::string DecodedCachePath(const std::string& index_path);

// Whether `t` makes the same pixels from an image whatever its random bits are.
bool TransformIsDeterministic(const ImageTransform& t);

// The size of a cache of `count` samples of `sample_bytes`.
uint64_t DecodedCacheFileBytes(int64_t count, size_t sample_bytes);

// Why dataset.decoded_cache `setting` ("auto" or empty, "off") does not cache a training split
// with `transform` whose cache would take `file_bytes`, with `memory_bytes` of memory and
// `free_disk_bytes` free in the work directory (negative: unknown, then no cache); empty when it
// does. The cache must fit in a quarter of the memory (so it stays in the page cache beside the
// ring, the model and the loaders) and in half the free disk.
std::string DecodedCacheRefusal(const std::string& setting, const ImageTransform& transform,
                                uint64_t file_bytes, int64_t memory_bytes, int64_t free_disk_bytes);

struct DecodedCacheInfo {
  int64_t decoded = 0;  // samples present
  int64_t absent = 0;   // in the subset but not decodable (the loaders will name them)
  uint64_t file_bytes = 0;
};

// Decodes LimitedSubset(index.count(), limit) of `index` (all when 0) with `transform` (which
// must be deterministic: else INVALID_ARGUMENT) on `threads` threads and writes the cache `path`.
// `stop` (may be empty) is asked between chunks; true ends the work with CANCELLED. A failed write
// (a full disk) is UNAVAILABLE naming `path`. Any error leaves nothing at `path` or beside it.
absl::StatusOr<DecodedCacheInfo> WriteDecodedCache(const SampleIndex& index,
                                                   const ImageTransform& transform, int64_t limit,
                                                   int threads, const std::string& path,
                                                   const std::function<bool()>& stop = {});

// A cache mapped read-only.
class DecodedCache {
 public:
  // Maps `path`. DATA_LOSS naming it when it is not a cache, is truncated, or was made for another
  // index (count, index_bytes) or sample size; NOT_FOUND when it does not exist.
  static absl::StatusOr<std::unique_ptr<DecodedCache>> Open(const std::string& path,
                                                            const SampleIndex& index,
                                                            size_t sample_bytes);
  ~DecodedCache();
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  // Sample i's pixels (sample_bytes), or null when it is absent.
  const uint8_t* Sample(int64_t i) const;
  int64_t count() const { return count_; }

 private:
  DecodedCache(const uint8_t* base, size_t bytes, int64_t count, size_t sample_bytes,
               size_t pixels_offset)
      : base_(base),
        bytes_(bytes),
        count_(count),
        sample_bytes_(sample_bytes),
        pixels_offset_(pixels_offset) {}

  const uint8_t* base_;
  size_t bytes_;
  int64_t count_;
  size_t sample_bytes_;
  size_t pixels_offset_;
};

}  // namespace stoker

#endif  // STOKER_DATA_DECODED_CACHE_H_
