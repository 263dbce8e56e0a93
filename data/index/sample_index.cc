// SampleIndex over a file image (owned after a build, or mapped), writing and opening index files.
#include "data/index/sample_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "data/index/index_format.h"

namespace stoker {
namespace {

const IndexFileHeader& Header(const uint8_t* bytes) {
  return *reinterpret_cast<const IndexFileHeader*>(bytes);
}

absl::Status ErrnoError(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
}

}  // namespace

struct SampleIndex::Mapping {
  void* address = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (address != nullptr) munmap(address, bytes);
  }
};

SampleIndex::SampleIndex() = default;
SampleIndex::~SampleIndex() = default;

SampleIndex::SampleIndex(SampleIndex&& other) noexcept { *this = std::move(other); }

SampleIndex& SampleIndex::operator=(SampleIndex&& other) noexcept {
  if (this == &other) return *this;
  owned_ = std::move(other.owned_);  // the buffer moves with its address
  mapping_ = std::move(other.mapping_);
  bytes_ = std::exchange(other.bytes_, nullptr);
  length_ = std::exchange(other.length_, 0);
  samples_ = std::exchange(other.samples_, nullptr);
  sources_ = std::exchange(other.sources_, nullptr);
  class_names_ = std::exchange(other.class_names_, nullptr);
  strings_ = std::exchange(other.strings_, nullptr);
  return *this;
}

void SampleIndex::Attach(const uint8_t* bytes, uint64_t length) {
  const IndexFileHeader& h = Header(bytes);
  const IndexLayout layout =
      ComputeIndexLayout(h.sample_count, h.source_count, h.class_name_count, h.strings_bytes);
  bytes_ = bytes;
  length_ = length;
  samples_ = reinterpret_cast<const IndexedSample*>(bytes + layout.samples);
  sources_ = bytes + layout.sources;
  class_names_ = reinterpret_cast<const uint32_t*>(bytes + layout.class_names);
  strings_ = reinterpret_cast<const char*>(bytes + layout.strings);
}

bool SampleIndex::sharded() const { return Header(bytes_).kind == kIndexKindShards; }
int64_t SampleIndex::count() const { return static_cast<int64_t>(Header(bytes_).sample_count); }
const IndexedSample& SampleIndex::sample(int64_t i) const { return samples_[i]; }
uint32_t SampleIndex::source_count() const { return Header(bytes_).source_count; }
int SampleIndex::classes() const { return static_cast<int>(Header(bytes_).classes); }
int64_t SampleIndex::skipped() const { return static_cast<int64_t>(Header(bytes_).skipped); }
int64_t SampleIndex::outside() const { return static_cast<int64_t>(Header(bytes_).outside); }
absl::string_view SampleIndex::root() const {
  return Header(bytes_).root_set == 1 ? absl::string_view(strings_ + Header(bytes_).root) : "";
}
uint64_t SampleIndex::index_bytes() const { return length_; }

absl::string_view SampleIndex::source_path(uint32_t source) const {
  return strings_ + reinterpret_cast<const SourceRecord*>(sources_)[source].path;
}

uint64_t SampleIndex::source_bytes(uint32_t source) const {
  return reinterpret_cast<const SourceRecord*>(sources_)[source].file_bytes;
}

int64_t SampleIndex::shard_begin(uint32_t s) const {
  if (s >= source_count()) return count();
  return static_cast<int64_t>(reinterpret_cast<const SourceRecord*>(sources_)[s].first_sample);
}

std::vector<std::string> SampleIndex::class_names() const {
  std::vector<std::string> names;
  for (uint32_t c = 0; c < Header(bytes_).class_name_count; ++c) {
    names.emplace_back(strings_ + class_names_[c]);
  }
  return names;
}

std::string SampleIndex::SampleName(int64_t i) const {
  const IndexedSample& s = samples_[i];
  if (!sharded()) return std::string(strings_ + s.name);
  return absl::StrCat(source_path(s.source), ":", strings_ + s.name);
}

absl::StatusOr<SampleIndex> SampleIndexAccess::FromOwned(std::vector<uint64_t> words,
                                                         uint64_t length, const std::string& what) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(words.data());
  STOKER_RETURN_IF_ERROR(ValidateIndexBytes(bytes, length, what));
  SampleIndex index;
  index.owned_ = std::move(words);
  index.Attach(reinterpret_cast<const uint8_t*>(index.owned_.data()), length);
  return index;
}

absl::StatusOr<SampleIndex> SampleIndexAccess::FromFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("cannot open sample index ", path));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t length = static_cast<uint64_t>(st.st_size);
  if (length < sizeof(IndexFileHeader)) {
    close(fd);
    return ValidateIndexBytes(nullptr, length, path);  // the "truncated" error
  }
  void* address = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  const int map_error = errno;
  close(fd);
  if (address == MAP_FAILED) {
    return ErrnoError(map_error, absl::StrCat("cannot map sample index ", path));
  }
  SampleIndex index;
  index.mapping_ = std::make_unique<SampleIndex::Mapping>();
  index.mapping_->address = address;
  index.mapping_->bytes = length;
  const uint8_t* bytes = static_cast<const uint8_t*>(address);
  STOKER_RETURN_IF_ERROR(ValidateIndexBytes(bytes, length, path));
  index.Attach(bytes, length);
  return index;
}

absl::Status WriteSampleIndex(const SampleIndex& index, const std::string& path) {
  std::string temporary = path + ".XXXXXX";
  const int fd = mkostemp(temporary.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("cannot create a temporary file for ", path));
  const uint8_t* bytes = SampleIndexAccess::Bytes(index);
  const uint64_t length = index.index_bytes();
  uint64_t written = 0;
  int error = 0;
  while (written < length) {
    const ssize_t n = write(fd, bytes + written, length - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : EIO;
      break;
    }
    written += static_cast<uint64_t>(n);
  }
  if (error == 0 && fchmod(fd, 0644) != 0) error = errno;
  if (error == 0 && fsync(fd) != 0) error = errno;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && rename(temporary.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    unlink(temporary.c_str());
    return ErrnoError(error, absl::StrFormat("cannot write sample index %s (at byte %d of %d)",
                                             path, written, length));
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleIndex> OpenSampleIndex(const std::string& path) {
  return SampleIndexAccess::FromFile(path);
}

}  // namespace stoker
