#include "data/decoded_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "data/file_bytes.h"
#include "data/image_dataset.h"

namespace stoker {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'O', 'K', 'D', 'C', 'A', 'C'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr size_t kAlign = 4096;
// Pixels decoded between writes (and between `stop` checks).
constexpr size_t kChunkBytes = size_t{32} << 20;

size_t PixelsOffset(int64_t count) {
  return (kHeaderBytes + static_cast<size_t>(count) + kAlign - 1) / kAlign * kAlign;
}

template <typename T>
void Put(std::vector<uint8_t>& out, T value) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(value));
}

template <typename T>
T Get(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(value));
  return value;
}

absl::Status WriteAll(int fd, const uint8_t* data, size_t size, uint64_t offset,
                      const std::string& path) {
  if (PwriteFully(fd, data, size, static_cast<off_t>(offset))) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("cannot write the decoded cache ", path, ": ",
                                             errno != 0 ? std::strerror(errno) : "no progress"));
}

// Removes the temporary file unless released.
class TempFile {
 public:
  TempFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~TempFile() {
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  absl::Status CloseAndRename(const std::string& to) {
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot write the decoded cache ", to, ": ", std::strerror(errno)));
    }
    if (rename(path_.c_str(), to.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot rename the decoded cache to ", to, ": ", std::strerror(errno)));
    }
    path_.clear();
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace

std::string DecodedCachePath(const std::string& index_path) { return index_path + ".decoded"; }

bool TransformIsDeterministic(const ImageTransform& t) {
  return !t.random_resized_crop && !t.horizontal_flip;
}

std::string DecodedCacheRefusal(const std::string& setting, const ImageTransform& transform,
                                uint64_t file_bytes, int64_t memory_bytes,
                                int64_t free_disk_bytes) {
  constexpr double kMiB = 1024.0 * 1024;
  if (setting == "off") return "dataset.decoded_cache is off";
  if (!TransformIsDeterministic(transform)) {
    return "the training transform is random (random_resized_crop or horizontal_flip), so "
           "every epoch decodes anew";
  }
  if (memory_bytes < 0 || file_bytes > static_cast<uint64_t>(memory_bytes) / 4) {
    return absl::StrFormat(
        "the decoded samples (%.0f MiB) would not fit in a quarter of the "
        "memory (%.0f MiB)",
        file_bytes / kMiB, std::max<int64_t>(memory_bytes, 0) / kMiB);
  }
  if (free_disk_bytes < 0 || file_bytes > static_cast<uint64_t>(free_disk_bytes) / 2) {
    return absl::StrFormat(
        "the decoded samples (%.0f MiB) would not fit in half the free disk "
        "of the work directory (%.0f MiB)",
        file_bytes / kMiB, std::max<int64_t>(free_disk_bytes, 0) / kMiB);
  }
  return "";
}

uint64_t DecodedCacheFileBytes(int64_t count, size_t sample_bytes) {
  return PixelsOffset(count) + static_cast<uint64_t>(count) * sample_bytes;
}

absl::StatusOr<DecodedCacheInfo> WriteDecodedCache(const SampleIndex& index,
                                                   const ImageTransform& transform, int64_t limit,
                                                   int threads, const std::string& path,
                                                   const std::function<bool()>& stop) {
  if (!TransformIsDeterministic(transform)) {
    return absl::InvalidArgumentError(
        "the training transform is random (random_resized_crop or horizontal_flip): its pixels "
        "differ every epoch and cannot be cached");
  }
  const size_t sample_bytes = TransformOutputBytes(transform);
  const int64_t count = index.count();
  if (sample_bytes == 0) return absl::InvalidArgumentError("the image transform produces nothing");
  if (count <= 0) return absl::InvalidArgumentError("the image dataset holds no samples");

  std::string temp_name = path + ".tmp-XXXXXX";
  const int fd = mkstemp(temp_name.data());
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the decoded cache ", path, ": ", std::strerror(errno)));
  }
  TempFile temp(fd, temp_name);
  const uint64_t file_bytes = DecodedCacheFileBytes(count, sample_bytes);
  // Reserve the space first: a disk too small fails here, not after minutes of decoding.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(file_bytes)); err != 0) {
    return absl::UnavailableError(absl::StrCat("cannot make the decoded cache ", path, " (",
                                               file_bytes, " bytes): ", std::strerror(err)));
  }

  // The positions to decode, in index order.
  std::vector<uint32_t> subset = LimitedSubset(count, limit);
  if (subset.empty()) {
    subset.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) subset[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  }  // else sorted already
  std::vector<uint8_t> present(static_cast<size_t>(count), 0);
  threads = std::max(1, threads);
  const size_t chunk = std::max<size_t>(static_cast<size_t>(threads),
                                        std::max<size_t>(1, kChunkBytes / sample_bytes));
  std::vector<uint8_t> pixels(std::min(chunk, subset.size()) * sample_bytes);
  std::vector<uint8_t> ok;
  DecodedCacheInfo info;
  const size_t pixels_offset = PixelsOffset(count);
  for (size_t first = 0; first < subset.size(); first += chunk) {
    if (stop && stop()) return absl::CancelledError("stopped while decoding the cache");
    const size_t n = std::min(chunk, subset.size() - first);
    ok.assign(n, 0);
    DecodeInParallel(index, transform, subset, static_cast<int64_t>(first), static_cast<int64_t>(n),
                     threads, pixels.data(), ok.data(), {});
    for (size_t j = 0; j < n; ++j) {
      if (ok[j]) {
        present[subset[first + j]] = 1;
      } else {
        std::memset(pixels.data() + j * sample_bytes, 0, sample_bytes);
      }
    }
    // Runs of consecutive positions go out in one write each (all of them without a limit).
    for (size_t j = 0; j < n;) {
      size_t run = 1;
      while (j + run < n && subset[first + j + run] == subset[first + j] + run) ++run;
      STOKER_RETURN_IF_ERROR(
          WriteAll(temp.fd(), pixels.data() + j * sample_bytes, run * sample_bytes,
                   pixels_offset + uint64_t{subset[first + j]} * sample_bytes, path));
      j += run;
    }
  }
  for (const uint32_t i : subset) {
    if (present[i]) {
      ++info.decoded;
    } else {
      ++info.absent;
    }
  }
  std::vector<uint8_t> head;
  head.insert(head.end(), kMagic, kMagic + sizeof(kMagic));
  Put<uint32_t>(head, kVersion);
  Put<uint32_t>(head, static_cast<uint32_t>(sample_bytes));
  Put<uint64_t>(head, static_cast<uint64_t>(count));
  Put<uint64_t>(head, index.index_bytes());
  head.insert(head.end(), present.begin(), present.end());
  STOKER_RETURN_IF_ERROR(WriteAll(temp.fd(), head.data(), head.size(), 0, path));
  STOKER_RETURN_IF_ERROR(temp.CloseAndRename(path));
  info.file_bytes = file_bytes;
  return info;
}

absl::StatusOr<std::unique_ptr<DecodedCache>> DecodedCache::Open(const std::string& path,
                                                                 const SampleIndex& index,
                                                                 size_t sample_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why =
        absl::StrCat(path, ": cannot open the decoded cache: ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(why) : absl::DataLossError(why);
  }
  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  const int64_t count = index.count();
  const uint64_t expected = DecodedCacheFileBytes(count, sample_bytes);
  if (static_cast<uint64_t>(st.st_size) != expected) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, ": the decoded cache has ", st.st_size,
                                            " bytes, not the ", expected, " its index needs"));
  }
  void* base = mmap(nullptr, expected, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return absl::DataLossError(absl::StrCat(path, ": cannot map: ", std::strerror(errno)));
  }
  const auto* bytes = static_cast<const uint8_t*>(base);
  std::unique_ptr<DecodedCache> cache(
      new DecodedCache(bytes, expected, count, sample_bytes, PixelsOffset(count)));
  if (std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0 || Get<uint32_t>(bytes + 8) != kVersion ||
      Get<uint32_t>(bytes + 12) != sample_bytes ||
      Get<uint64_t>(bytes + 16) != static_cast<uint64_t>(count) ||
      Get<uint64_t>(bytes + 24) != index.index_bytes()) {
    return absl::DataLossError(absl::StrCat(path, ": not a decoded cache of this index (", count,
                                            " samples of ", sample_bytes, " bytes)"));
  }
  // Readahead would fetch pixels in file order; the loaders read in the epoch's order.
  madvise(base, expected, MADV_RANDOM);
  return cache;
}

DecodedCache::~DecodedCache() { munmap(const_cast<uint8_t*>(base_), bytes_); }

const uint8_t* DecodedCache::Sample(int64_t i) const {
  if (i < 0 || i >= count_ || base_[kHeaderBytes + static_cast<size_t>(i)] == 0) return nullptr;
  return base_ + pixels_offset_ + static_cast<size_t>(i) * sample_bytes_;
}

}  // namespace stoker
