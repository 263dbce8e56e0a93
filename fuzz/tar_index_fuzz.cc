// libFuzzer target: bytes as a tar shard (written to a temporary file) through BuildShardIndex,
// and the same bytes as a sample index file (with its CRC made valid, so that the record checks
// are reached) through the index validation and every accessor.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/index/index_format.h"
#include "data/index/sample_index.h"

namespace {

// One file per fuzzing process, rewritten for every input.
const std::string& ShardPath() {
  static const std::string path = [] {
    std::string pattern = "/tmp/tar_index_fuzz-XXXXXX";
    const int fd = mkstemp(pattern.data());
    if (fd < 0) std::abort();
    close(fd);
    return pattern;
  }();
  static const bool removed_at_exit = std::atexit([] { unlink(path.c_str()); }) == 0;
  (void)removed_at_exit;
  return path;
}

void WriteShard(const uint8_t* data, size_t size) {
  const int fd = open(ShardPath().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) std::abort();
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) std::abort();
    written += static_cast<size_t>(n);
  }
  close(fd);
}

void CheckShard(const uint8_t* data, size_t size) {
  WriteShard(data, size);
  absl::StatusOr<stoker::SampleIndex> index = stoker::BuildShardIndex(ShardPath(), nullptr);
  if (!index.ok()) {
    // Every error names the shard.
    if (index.status().message().find(ShardPath()) == absl::string_view::npos) std::abort();
    return;
  }
  // Samples lie within the shard, after a tar header.
  for (int64_t i = 0; i < index->count(); ++i) {
    const stoker::IndexedSample& s = index->sample(i);
    if (s.offset < 512 || s.offset % 512 != 0 || s.offset > size || s.size > size - s.offset ||
        s.source != 0) {
      std::abort();
    }
  }
}

void CheckIndexBytes(const uint8_t* data, size_t size) {
  std::vector<uint64_t> words((size + 7) / 8, 0);
  if (size > 0) std::memcpy(words.data(), data, size);
  auto* bytes = reinterpret_cast<uint8_t*>(words.data());
  if (size >= sizeof(stoker::IndexFileHeader)) {
    stoker::IndexFileHeader header;
    std::memcpy(&header, bytes, sizeof(header));
    header.body_crc32 =
        static_cast<uint32_t>(crc32_z(0, bytes + sizeof(header), size - sizeof(header)));
    std::memcpy(bytes, &header, sizeof(header));
  }
  absl::StatusOr<stoker::SampleIndex> index =
      stoker::SampleIndexAccess::FromOwned(std::move(words), size, "fuzz.index");
  if (!index.ok()) {
    if (index.status().message().find("fuzz.index") == absl::string_view::npos) std::abort();
    return;
  }
  // A valid index: every accessor stays within it (AddressSanitizer watches).
  size_t total = 0;
  for (int64_t i = 0; i < index->count(); ++i) {
    const stoker::IndexedSample& s = index->sample(i);
    total += index->SampleName(i).size() + index->source_path(s.source).size();
    if (s.label >= index->classes()) std::abort();
  }
  for (uint32_t s = 0; s <= index->source_count(); ++s) total += index->shard_begin(s);
  for (const std::string& name : index->class_names()) total += name.size();
  const std::vector<uint32_t> order = stoker::EpochSampleOrder(*index, 1, 2, 3);
  if (static_cast<int64_t>(order.size()) != index->count()) std::abort();
  if (total == SIZE_MAX) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckShard(data, size);
  CheckIndexBytes(data, size);
  return 0;
}
