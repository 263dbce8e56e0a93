// A worker's cache of restart-indexed copies of an image folder's JPEGs (jpeg_restart.h): the
// loaders transcode a JPEG once, the first time a job reads it, and read the copy from then on, in
// later epochs and later jobs, so that a crop low in the image decodes without Huffman-decoding the
// rows above it (image_decoder.h). It lives in a directory of its own (stoker-worker
// --jpeg-cache-dir), shared by every loader of every job on the worker.
//
// Contract:
// - Keyed by the file's identity, taken from fstat of the descriptor the original was read
//   through: its path (as the index names it), size, mtime in ns, device and inode. A file that
//   changes (rewritten, replaced, touched) has another key, so a stale copy is never used; the old
//   entry ages out.
// - Layout: DIR/ab/<sha256 of the key, hex>.jpg (ab: its first two digits) holds a 24-byte header
//   (magic, payload length, CRC-32 of the payload) and the restart-marked JPEG. Files that cannot
//   be transcoded (not a JPEG, progressive, arithmetic-coded, damaged) get an empty
//   DIR/ab/<hash>.none, so they are not tried again every epoch. DIR/usage holds the bytes the
//   entries take, DIR/evict.lock serializes eviction, DIR/tmp/ holds entries being written.
// - Verified on every read: magic, length and CRC (~20 us for 100 KiB, zlib's crc32 at 5 GB/s,
//   beside milliseconds to decode). An entry that fails is deleted and reported missing, so the
//   caller uses the original; a caller whose decode of a copy fails calls Forget.
// - Concurrent builders (the loaders of every job, in separate processes) are safe: an entry is
//   written to a temporary file (O_EXCL, random name) and renamed into place, so a reader sees a
//   whole entry or none. Renames, deletions and the usage file change together under flock of
//   DIR/usage, held for microseconds; a builder that finds the entry already there drops its copy.
//   A writer killed mid-way leaves only a temporary, removed by the next Open or eviction once it
//   is older than stale_temp_age.
// - A hard size bound: an entry is stored only when the recorded usage plus its bytes stays within
//   max_bytes; otherwise the least recently used entries are deleted (one process at a time, the
//   others meanwhile skip storing) until usage is at most 90 % of the bound less the new entry,
//   and it is stored if that made room. Recency is the entry's mtime, set when it is written and
//   advanced on a hit only when older than touch_interval (10 min by default): one futimens per
//   entry per interval, not a metadata write per image read, at the cost of LRU order being
//   exact only to within the interval (an epoch of a large dataset is longer than it). The bytes
//   counted are the entries' file sizes; a .none entry counts none. The usage is recounted from
//   the directory when the usage file is missing; a process killed inside the critical section
//   leaves it counting too much, never too little.
// - Private to the worker's user: entries are 0600 in 0700 subdirectories (the copies are the
//   dataset's images, whatever the originals' permissions).
// - Everything fails safe: errors are counted (stats().errors) and reported as a miss or as not
//   stored, never as a failed sample.
//
// Thread-compatible (one call at a time: flock does not exclude threads sharing a descriptor): one
// JpegCache per loader, whose counters are its own; processes share the directory.
#ifndef STOKER_DATA_JPEG_CACHE_H_
#define STOKER_DATA_JPEG_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stoker {

// What a cache entry is keyed by.
struct JpegFileIdentity {
  std::string path;
  int64_t size_bytes = 0;
  int64_t mtime_ns = 0;
  uint64_t device = 0;
  uint64_t inode = 0;
};

// The identity of the open file `fd`, which was opened as `path`; INTERNAL naming `path` when fstat
// fails or it is not a regular file.
absl::StatusOr<JpegFileIdentity> IdentifyOpenFile(int fd, absl::string_view path);

inline constexpr int64_t kDefaultJpegCacheBytes = int64_t{10240} << 20;

struct JpegCacheOptions {
  std::string dir;  // created (with its parents) when missing
  int64_t max_bytes = kDefaultJpegCacheBytes;
  absl::Duration touch_interval = absl::Minutes(10);
  absl::Duration stale_temp_age = absl::Minutes(10);
};

// What one JpegCache did, since it was opened.
struct JpegCacheStats {
  uint64_t hits = 0;              // restart-marked copies read
  uint64_t built = 0;             // copies made (stored, or found stored by another builder)
  uint64_t not_transcodable = 0;  // files kept as they are: negative entries made or found
  uint64_t not_stored = 0;        // transcoded, but no room within the bound
  uint64_t errors = 0;            // I/O errors, bad entries deleted, copies that did not decode
  uint64_t evicted = 0;           // entries this cache's evictions deleted
  int64_t build_ns = 0;           // transcoding and writing the copies
  uint64_t original_bytes = 0;    // of the files transcoded
  uint64_t marked_bytes = 0;      // of their restart-marked copies
};

// "1000 hits, 24 built (2.3 MiB -> 2.4 MiB, 84 ms), 3 not transcodable (kept as they are)", the
// counters that are not zero ("nothing" when none is).
std::string DescribeJpegCacheStats(const JpegCacheStats& stats);
// `now` less `before`, counter by counter.
JpegCacheStats JpegCacheStatsSince(const JpegCacheStats& now, const JpegCacheStats& before);

class JpegCache {
 public:
  // Creates the directory (and DIR/tmp) if needed, opens the usage file (recounting the entries
  // when it is new) and removes stale temporaries. INVALID_ARGUMENT for an empty dir or a bound
  // below 1 MiB; UNAVAILABLE naming the path for what cannot be created or opened.
  static absl::StatusOr<std::unique_ptr<JpegCache>> Open(JpegCacheOptions options);
  ~JpegCache();
  JpegCache(const JpegCache&) = delete;
  JpegCache& operator=(const JpegCache&) = delete;

  enum class Found { kMarked, kNotTranscodable, kMissing };
  // kMarked: `marked` holds the file's verified restart-marked copy. kNotTranscodable: a negative
  // entry says the original must be used as it is. kMissing: no usable entry (a bad one was
  // deleted); use the original and Store it.
  Found Find(const JpegFileIdentity& file, std::vector<uint8_t>* marked);

  enum class Stored { kMarked, kNotTranscodable, kNoRoom, kError };
  // Transcodes the original bytes of `file` and stores the copy (kMarked, also when another
  // builder stored it first), or a negative entry when they cannot be transcoded
  // (kNotTranscodable); kNoRoom when the copy does not fit the bound even after eviction (or
  // another process is evicting), kError when the cache's files fail.
  Stored Store(const JpegFileIdentity& file, const uint8_t* original, size_t size);

  // The copy Find gave did not decode: deletes the entry (counted in errors).
  void Forget(const JpegFileIdentity& file);

  // Where `file`'s entry is kept (negative: its .none), relative paths under the directory joined.
  std::string EntryPath(const JpegFileIdentity& file, bool negative = false) const;
  // The bytes DIR/usage records (-1 when it cannot be read).
  int64_t RecordedUsageBytes();

  const JpegCacheStats& stats() const { return stats_; }

 private:
  explicit JpegCache(JpegCacheOptions options);
  absl::Status Init();
  // Deletes least recently used entries until the recorded usage is at most `target` bytes.
  // False when another process is evicting (nothing done).
  bool Evict(int64_t target);
  void RemoveStaleTemporaries();
  // Deletes entry `name` (relative to the directory) under the usage lock when it is still inode
  // `inode` (0: whichever), subtracting its bytes; true when it was deleted.
  bool RemoveEntry(const std::string& name, uint64_t inode);
  // Sums the entries' sizes by walking the directory.
  int64_t CountEntryBytes();
  void TouchIfOld(int fd, const std::string& name, int64_t mtime_ns);
  std::string TemporaryName();

  const JpegCacheOptions options_;
  int dir_fd_ = -1;
  int usage_fd_ = -1;
  int evict_fd_ = -1;
  uint64_t temp_seed_ = 0;
  uint64_t temp_counter_ = 0;
  JpegCacheStats stats_;
};

}  // namespace stoker

#endif  // STOKER_DATA_JPEG_CACHE_H_
