// Whole-file reads and gzip inflation for the dataset readers.
#include "data/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stoker {
namespace {

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool IsGzipAt(const std::vector<uint8_t>& bytes, size_t at) {
  return bytes.size() >= at + 2 && bytes[at] == 0x1f && bytes[at + 1] == 0x8b;
}

}  // namespace

bool PreadFully(int fd, void* data, size_t size, off_t offset) {
  for (size_t done = 0; done < size;) {
    const ssize_t n =
        pread(fd, static_cast<char*>(data) + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool PwriteFully(int fd, const void* data, size_t size, off_t offset) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = pwrite(fd, static_cast<const char*>(data) + done, size - done,
                             offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": stat"));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a file"));
  if (static_cast<uint64_t>(st.st_size) > kMaxDatasetFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.st_size, " bytes is too large"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed at offset ", done));
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

absl::StatusOr<std::vector<uint8_t>> Gunzip(const std::string& path,
                                            const std::vector<uint8_t>& compressed) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": gzip: cannot initialise zlib"));
  }
  struct InflateEnd {
    z_stream* zs;
    ~InflateEnd() { inflateEnd(zs); }
  } inflate_end{&zs};

  // The gzip trailer holds the uncompressed size mod 2^32: a good first guess for the output.
  // A truncated file's last bytes are not a trailer, so the guess is bounded by deflate's best
  // ratio (about 1032:1) and 1 GiB; the buffer grows if the guess was short.
  uint64_t guess = uint64_t{compressed.size()} * 4;
  if (compressed.size() >= 18) {
    const uint8_t* t = compressed.data() + compressed.size() - 4;
    const uint64_t trailer =
        uint32_t{t[0]} | uint32_t{t[1]} << 8 | uint32_t{t[2]} << 16 | uint32_t{t[3]} << 24;
    if (trailer <= uint64_t{compressed.size()} * 1032) guess = trailer;
  }
  std::vector<uint8_t> out(std::clamp<uint64_t>(guess, 1, uint64_t{1} << 30));
  size_t out_used = 0;
  size_t in_fed = 0;  // bytes handed to zlib so far
  zs.avail_in = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_fed < compressed.size()) {
      const size_t chunk = std::min<size_t>(compressed.size() - in_fed, 1u << 30);
      zs.next_in = const_cast<Bytef*>(compressed.data() + in_fed);
      zs.avail_in = static_cast<uInt>(chunk);
      in_fed += chunk;
    }
    if (out_used == out.size()) {
      if (out.size() >= kMaxDatasetFileBytes) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": gzip: decompresses to more than ",
                                                       kMaxDatasetFileBytes, " bytes"));
      }
      out.resize(
          std::min<uint64_t>(std::max<size_t>(out.size() * 2, 1 << 16), kMaxDatasetFileBytes));
    }
    const size_t room = std::min<size_t>(out.size() - out_used, 1u << 30);
    zs.next_out = out.data() + out_used;
    zs.avail_out = static_cast<uInt>(room);
    const int ret = inflate(&zs, Z_NO_FLUSH);
    out_used += room - zs.avail_out;
    const size_t consumed = in_fed - zs.avail_in;
    if (ret == Z_STREAM_END) {
      if (consumed == compressed.size()) break;
      if (IsGzipAt(compressed, consumed)) {  // concatenated members, as `cat a.gz b.gz` makes
        inflateReset(&zs);
        continue;
      }
      return absl::DataLossError(absl::StrCat(path,
                                              ": gzip: unexpected data after the end of "
                                              "the compressed stream at offset ",
                                              consumed));
    }
    if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_STREAM_ERROR) {
      return absl::DataLossError(absl::StrCat(path, ": gzip: corrupt data near compressed offset ",
                                              consumed, ": ", zs.msg ? zs.msg : "inflate failed"));
    }
    if (ret == Z_MEM_ERROR) {
      return absl::ResourceExhaustedError(absl::StrCat(path, ": gzip: out of memory"));
    }
    // Z_OK or Z_BUF_ERROR: no progress is possible only when the input ran out with room to spare.
    if (zs.avail_in == 0 && in_fed == compressed.size() && zs.avail_out > 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": gzip: unexpected end of file at compressed offset ", compressed.size(), " (",
          out_used, " bytes decompressed); the file is truncated"));
    }
  }
  out.resize(out_used);
  return out;
}

bool IsGzip(const std::vector<uint8_t>& bytes) { return IsGzipAt(bytes, 0); }

absl::StatusOr<std::vector<uint8_t>> MaybeGunzip(const std::string& path,
                                                 std::vector<uint8_t> bytes) {
  if (!IsGzip(bytes)) return bytes;
  return Gunzip(path, bytes);
}

}  // namespace stoker
