#include "data/jpeg_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "data/file_bytes.h"
#include "data/image/image_codec.h"
#include "data/image/jpeg_restart.h"
#include "data/split_mix.h"

namespace stoker {
namespace {

// An entry: kMagic, the payload's length (8 bytes, little-endian), its CRC-32 (4 bytes), 4 zero
// bytes, then the payload (the restart-marked JPEG).
constexpr char kMagic[8] = {'S', 'T', 'K', 'J', 'R', 'S', 'T', '1'};
constexpr size_t kHeaderBytes = 24;
constexpr char kUsageFile[] = "usage";
constexpr char kEvictLockFile[] = "evict.lock";
constexpr char kTempDir[] = "tmp";
constexpr int kUsageDigits = 20;  // DIR/usage: the bytes in 20 decimal digits and a newline

void PutLittleEndian(uint64_t value, int bytes, uint8_t* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLittleEndian(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

uint32_t Crc32(const uint8_t* data, size_t size) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), data, size));
}

int64_t MtimeNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

// An exclusive flock held for the scope (none when the descriptor is -1 or the lock failed).
class FlockGuard {
 public:
  FlockGuard(int fd, bool wait) {
    int result;
    do {
      result = flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
    } while (result != 0 && errno == EINTR);
    fd_ = result == 0 ? fd : -1;
  }
  ~FlockGuard() {
    if (fd_ >= 0) flock(fd_, LOCK_UN);
  }
  FlockGuard(const FlockGuard&) = delete;
  FlockGuard& operator=(const FlockGuard&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The bytes DIR/usage records, -1 when it is empty or unreadable (then the entries are counted).
int64_t ReadUsage(int fd) {
  char text[kUsageDigits + 2] = {0};
  const ssize_t n = pread(fd, text, kUsageDigits + 1, 0);
  if (n != kUsageDigits + 1) return -1;
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(text, n)), &value)) return -1;
  return value;
}

bool WriteUsage(int fd, int64_t bytes) {
  const std::string text = absl::StrFormat("%0*d\n", kUsageDigits, std::max<int64_t>(0, bytes));
  return PwriteFully(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 0);
}

struct EntryFile {
  int64_t mtime_ns;
  int64_t bytes;  // 0 for a .none
  std::string name;
  uint64_t inode;
};

// Every entry under the directory `dir_fd` (DIR/ab/NAME.jpg or .none), unordered.
std::vector<EntryFile> ScanEntries(int dir_fd) {
  std::vector<EntryFile> entries;
  const int top_fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (top_fd < 0) return entries;
  DIR* top = fdopendir(top_fd);
  if (top == nullptr) {
    close(top_fd);
    return entries;
  }
  while (const dirent* sub = readdir(top)) {
    const std::string sub_name = sub->d_name;
    if (sub_name.size() != 2 || !absl::ascii_isxdigit(sub_name[0]) ||
        !absl::ascii_isxdigit(sub_name[1])) {
      continue;
    }
    const int sub_fd = openat(dir_fd, sub_name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sub_fd < 0) continue;
    DIR* files = fdopendir(sub_fd);
    if (files == nullptr) {
      close(sub_fd);
      continue;
    }
    while (const dirent* file = readdir(files)) {
      const std::string name = file->d_name;
      const bool marked = absl::EndsWith(name, ".jpg");
      if (!marked && !absl::EndsWith(name, ".none")) continue;
      struct stat st;
      if (fstatat(sub_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
        continue;
      }
      entries.push_back({MtimeNs(st), marked ? static_cast<int64_t>(st.st_size) : 0,
                         absl::StrCat(sub_name, "/", name), static_cast<uint64_t>(st.st_ino)});
    }
    closedir(files);
  }
  closedir(top);
  return entries;
}

int64_t SumBytes(const std::vector<EntryFile>& entries) {
  int64_t total = 0;
  for (const EntryFile& e : entries) total += e.bytes;
  return total;
}

}  // namespace

absl::StatusOr<JpegFileIdentity> IdentifyOpenFile(int fd, absl::string_view path) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InternalError(absl::StrCat(path, ": not a regular file"));
  JpegFileIdentity identity;
  identity.path = std::string(path);
  identity.size_bytes = static_cast<int64_t>(st.st_size);
  identity.mtime_ns = MtimeNs(st);
  identity.device = static_cast<uint64_t>(st.st_dev);
  identity.inode = static_cast<uint64_t>(st.st_ino);
  return identity;
}

std::string DescribeJpegCacheStats(const JpegCacheStats& s) {
  std::vector<std::string> parts;
  if (s.hits > 0) parts.push_back(absl::StrCat(s.hits, " hits"));
  if (s.built > 0) {
    parts.push_back(absl::StrFormat("%d built (%.1f MiB -> %.1f MiB, %.0f ms)", s.built,
                                    s.original_bytes / 1048576.0, s.marked_bytes / 1048576.0,
                                    s.build_ns / 1e6));
  }
  if (s.not_transcodable > 0) {
    parts.push_back(absl::StrCat(s.not_transcodable, " not transcodable (kept as they are)"));
  }
  if (s.not_stored > 0) parts.push_back(absl::StrCat(s.not_stored, " not stored (cache full)"));
  if (s.evicted > 0) parts.push_back(absl::StrCat(s.evicted, " evicted"));
  if (s.errors > 0) parts.push_back(absl::StrCat(s.errors, s.errors == 1 ? " error" : " errors"));
  return parts.empty() ? "nothing" : absl::StrJoin(parts, ", ");
}

JpegCacheStats JpegCacheStatsSince(const JpegCacheStats& now, const JpegCacheStats& before) {
  JpegCacheStats d;
  d.hits = now.hits - before.hits;
  d.built = now.built - before.built;
  d.not_transcodable = now.not_transcodable - before.not_transcodable;
  d.not_stored = now.not_stored - before.not_stored;
  d.errors = now.errors - before.errors;
  d.evicted = now.evicted - before.evicted;
  d.build_ns = now.build_ns - before.build_ns;
  d.original_bytes = now.original_bytes - before.original_bytes;
  d.marked_bytes = now.marked_bytes - before.marked_bytes;
  return d;
}

JpegCache::JpegCache(JpegCacheOptions options) : options_(std::move(options)) {}

JpegCache::~JpegCache() {
  for (const int fd : {dir_fd_, usage_fd_, evict_fd_}) {
    if (fd >= 0) close(fd);
  }
}

absl::StatusOr<std::unique_ptr<JpegCache>> JpegCache::Open(JpegCacheOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("the JPEG cache needs a directory");
  if (options.max_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("JPEG cache bound of ", options.max_bytes, " bytes: give a positive bound"));
  }
  std::unique_ptr<JpegCache> cache(new JpegCache(std::move(options)));
  if (absl::Status s = cache->Init(); !s.ok()) return s;
  return cache;
}

absl::Status JpegCache::Init() {
  const std::string& dir = options_.dir;
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(dir) / kTempDir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the JPEG cache directory ", dir, ": ", error.message()));
  }
  dir_fd_ = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", dir, ": ", std::strerror(errno)));
  }
  usage_fd_ = openat(dir_fd_, kUsageFile, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  evict_fd_ = openat(dir_fd_, kEvictLockFile, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (usage_fd_ < 0 || evict_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", dir, "/", kUsageFile, " or ",
                                               kEvictLockFile, ": ", std::strerror(errno)));
  }
  {
    FlockGuard lock(usage_fd_, /*wait=*/true);
    if (!lock.held()) {
      return absl::UnavailableError(
          absl::StrCat("cannot lock ", dir, "/", kUsageFile, ": ", std::strerror(errno)));
    }
    if (ReadUsage(usage_fd_) < 0 && !WriteUsage(usage_fd_, CountEntryBytes())) {
      return absl::UnavailableError(
          absl::StrCat("cannot write ", dir, "/", kUsageFile, ": ", std::strerror(errno)));
    }
  }
  RemoveStaleTemporaries();
  temp_seed_ =
      SplitMix64((uint64_t{std::random_device{}()} << 32) ^ static_cast<uint64_t>(getpid()) ^
                 static_cast<uint64_t>(absl::GetCurrentTimeNanos()));
  return absl::OkStatus();
}

std::string JpegCache::EntryPath(const JpegFileIdentity& file, bool negative) const {
  const std::string key = absl::StrCat(file.path, std::string(1, '\0'), file.size_bytes, "/",
                                       file.mtime_ns, "/", file.device, "/", file.inode);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  std::string hex;
  for (const unsigned char byte : digest) absl::StrAppendFormat(&hex, "%02x", byte);
  return absl::StrCat(hex.substr(0, 2), "/", hex, negative ? ".none" : ".jpg");
}

int64_t JpegCache::RecordedUsageBytes() {
  FlockGuard lock(usage_fd_, /*wait=*/true);
  return ReadUsage(usage_fd_);
}

int64_t JpegCache::CountEntryBytes() { return SumBytes(ScanEntries(dir_fd_)); }

std::string JpegCache::TemporaryName() {
  return absl::StrFormat("%s/%d-%016x.part", kTempDir, getpid(),
                         SplitMix64(temp_seed_ + temp_counter_++));
}

void JpegCache::RemoveStaleTemporaries() {
  const int fd = openat(dir_fd_, kTempDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return;
  }
  const int64_t now = absl::GetCurrentTimeNanos();
  const int64_t max_age = absl::ToInt64Nanoseconds(options_.stale_temp_age);
  while (const dirent* entry = readdir(dir)) {
    struct stat st;
    if (entry->d_name[0] == '.' || fstatat(fd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode)) {
      continue;
    }
    if (now - MtimeNs(st) > max_age) unlinkat(fd, entry->d_name, 0);
  }
  closedir(dir);
}

void JpegCache::TouchIfOld(int fd, const std::string& name, int64_t mtime_ns) {
  const int64_t now = absl::GetCurrentTimeNanos();
  if (now - mtime_ns < absl::ToInt64Nanoseconds(options_.touch_interval)) return;
  const struct timespec times[2] = {{0, UTIME_OMIT}, {now / 1000000000, now % 1000000000}};
  // Best effort: an entry that cannot be touched only ages sooner.
  if (fd >= 0) {
    futimens(fd, times);
  } else {
    utimensat(dir_fd_, name.c_str(), times, AT_SYMLINK_NOFOLLOW);
  }
}

JpegCache::Found JpegCache::Find(const JpegFileIdentity& file, std::vector<uint8_t>* marked) {
  const std::string name = EntryPath(file);
  const int fd = openat(dir_fd_, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno != ENOENT) {
      ++stats_.errors;
      return Found::kMissing;
    }
    const std::string negative = EntryPath(file, /*negative=*/true);
    struct stat st;
    if (fstatat(dir_fd_, negative.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Found::kMissing;
    TouchIfOld(-1, negative, MtimeNs(st));
    ++stats_.not_transcodable;
    return Found::kNotTranscodable;
  }
  struct stat st = {};
  uint8_t header[kHeaderBytes];
  bool good = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
              static_cast<size_t>(st.st_size) > kHeaderBytes &&
              PreadFully(fd, header, kHeaderBytes, 0) &&
              std::memcmp(header, kMagic, sizeof kMagic) == 0 &&
              GetLittleEndian(header + 8, 8) == static_cast<uint64_t>(st.st_size) - kHeaderBytes;
  if (good) {
    marked->resize(static_cast<size_t>(st.st_size) - kHeaderBytes);
    good = PreadFully(fd, marked->data(), marked->size(), kHeaderBytes) &&
           Crc32(marked->data(), marked->size()) == GetLittleEndian(header + 16, 4);
  }
  if (!good) {
    close(fd);
    RemoveEntry(name, static_cast<uint64_t>(st.st_ino));
    ++stats_.errors;
    return Found::kMissing;
  }
  TouchIfOld(fd, name, MtimeNs(st));
  close(fd);
  ++stats_.hits;
  return Found::kMarked;
}

void JpegCache::Forget(const JpegFileIdentity& file) {
  ++stats_.errors;
  RemoveEntry(EntryPath(file), 0);
}

bool JpegCache::RemoveEntry(const std::string& name, uint64_t inode) {
  FlockGuard lock(usage_fd_, /*wait=*/true);
  struct stat st;
  if (fstatat(dir_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (inode != 0 && static_cast<uint64_t>(st.st_ino) != inode) return false;
  if (unlinkat(dir_fd_, name.c_str(), 0) != 0) return false;
  if (lock.held() && absl::EndsWith(name, ".jpg")) {
    const int64_t usage = ReadUsage(usage_fd_);
    if (usage >= 0) WriteUsage(usage_fd_, usage - static_cast<int64_t>(st.st_size));
  }
  return true;
}

JpegCache::Stored JpegCache::Store(const JpegFileIdentity& file, const uint8_t* original,
                                   size_t size) {
  const int64_t start_ns = absl::GetCurrentTimeNanos();
  const std::string name = EntryPath(file);
  const std::string sub = name.substr(0, 2);
  if (mkdirat(dir_fd_, sub.c_str(), 0700) != 0 && errno != EEXIST) {
    ++stats_.errors;
    return Stored::kError;
  }
  absl::StatusOr<std::vector<uint8_t>> marked =
      SniffImageEncoding(original, size) == ImageEncoding::kJpeg
          ? AddJpegRestartMarkers(file.path, original, size)
          : absl::InvalidArgumentError("not a JPEG");
  if (marked.ok() && !IndexJpegRows(marked->data(), marked->size()).has_value()) {
    marked = absl::InternalError("the transcoded copy has no row index");
  }
  if (!marked.ok()) {
    // An empty file, so created in place: a reader sees it or not, never part of it.
    const std::string negative = EntryPath(file, /*negative=*/true);
    const int fd = openat(dir_fd_, negative.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) close(fd);
    if (fd < 0 && errno != EEXIST) {
      ++stats_.errors;
      return Stored::kError;
    }
    ++stats_.not_transcodable;
    return Stored::kNotTranscodable;
  }
  const int64_t entry_bytes = static_cast<int64_t>(kHeaderBytes + marked->size());
  if (entry_bytes > options_.max_bytes) {
    ++stats_.not_stored;
    return Stored::kNoRoom;
  }
  // The entry, written whole to a temporary file.
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
    temp = TemporaryName();
    fd = openat(dir_fd_, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    ++stats_.errors;
    return Stored::kError;
  }
  uint8_t header[kHeaderBytes] = {0};
  std::memcpy(header, kMagic, sizeof kMagic);
  PutLittleEndian(marked->size(), 8, header + 8);
  PutLittleEndian(Crc32(marked->data(), marked->size()), 4, header + 16);
  // The mtime (its recency) to the nanosecond, not the kernel's coarser file clock.
  const int64_t now = absl::GetCurrentTimeNanos();
  const struct timespec times[2] = {{0, UTIME_OMIT}, {now / 1000000000, now % 1000000000}};
  bool written = PwriteFully(fd, header, kHeaderBytes, 0) &&
                 PwriteFully(fd, marked->data(), marked->size(), kHeaderBytes) &&
                 futimens(fd, times) == 0;
  written = close(fd) == 0 && written;
  auto done = [&](Stored how) {
    if (how != Stored::kMarked) unlinkat(dir_fd_, temp.c_str(), 0);
    if (how == Stored::kMarked) {
      ++stats_.built;
      stats_.original_bytes += size;
      stats_.marked_bytes += marked->size();
      stats_.build_ns += absl::GetCurrentTimeNanos() - start_ns;
    } else if (how == Stored::kNoRoom) {
      ++stats_.not_stored;
    } else {
      ++stats_.errors;
    }
    return how;
  };
  if (!written) return done(Stored::kError);
  // Into place under the usage lock, if it fits (after an eviction if need be).
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      FlockGuard lock(usage_fd_, /*wait=*/true);
      if (!lock.held()) return done(Stored::kError);
      struct stat st;
      if (fstatat(dir_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        unlinkat(dir_fd_, temp.c_str(), 0);  // another builder stored it first
        return done(Stored::kMarked);
      }
      int64_t usage = ReadUsage(usage_fd_);
      if (usage < 0) usage = CountEntryBytes();
      if (usage + entry_bytes <= options_.max_bytes) {
        // Counted before the rename: a process killed between the two counts too much.
        if (!WriteUsage(usage_fd_, usage + entry_bytes)) return done(Stored::kError);
        if (renameat(dir_fd_, temp.c_str(), dir_fd_, name.c_str()) != 0) {
          WriteUsage(usage_fd_, usage);
          return done(Stored::kError);
        }
        return done(Stored::kMarked);
      }
    }
    const int64_t target = options_.max_bytes / 10 * 9 - entry_bytes;
    if (attempt > 0 || target < 0 || !Evict(target)) break;
  }
  return done(Stored::kNoRoom);
}

bool JpegCache::Evict(int64_t target) {
  FlockGuard evicting(evict_fd_, /*wait=*/false);
  if (!evicting.held()) return false;
  RemoveStaleTemporaries();
  // The slow part, a walk of the directory, without the usage lock; the deletions under it.
  std::vector<EntryFile> entries = ScanEntries(dir_fd_);
  std::sort(entries.begin(), entries.end(), [](const EntryFile& a, const EntryFile& b) {
    return std::tie(a.mtime_ns, a.name) < std::tie(b.mtime_ns, b.name);
  });
  FlockGuard lock(usage_fd_, /*wait=*/true);
  if (!lock.held()) return false;
  int64_t usage = ReadUsage(usage_fd_);
  if (usage < 0) usage = SumBytes(entries);
  size_t next = 0;
  for (; next < entries.size() && usage > target; ++next) {
    const EntryFile& e = entries[next];
    struct stat st;
    if (fstatat(dir_fd_, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        static_cast<uint64_t>(st.st_ino) != e.inode || unlinkat(dir_fd_, e.name.c_str(), 0) != 0) {
      continue;
    }
    if (absl::EndsWith(e.name, ".jpg")) usage -= static_cast<int64_t>(st.st_size);
    ++stats_.evicted;
  }
  // Every entry seen is gone and the usage still says more: it counted a killed writer's bytes.
  if (next == entries.size() && usage > target) usage = CountEntryBytes();
  WriteUsage(usage_fd_, usage);
  return true;
}

}  // namespace stoker
