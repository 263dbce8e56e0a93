// Whole-file reads shared by the dataset readers, with gzip detected from the first bytes.
#ifndef STOKER_DATA_FILE_BYTES_H_
#define STOKER_DATA_FILE_BYTES_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stoker {

// Nothing bigger than this is read or decompressed: it cannot be a dataset we hold in memory.
inline constexpr uint64_t kMaxDatasetFileBytes = uint64_t{1} << 36;

// Reads a regular file whole. Errors name the file (and the offset of a failed read).
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

// pread / pwrite of exactly `size` bytes at `offset`, retrying interrupted and short transfers.
// False on an error (errno says which) or when the file ends, or nothing is written, first
// (errno 0).
bool PreadFully(int fd, void* data, size_t size, off_t offset);
bool PwriteFully(int fd, const void* data, size_t size, off_t offset);

// True if `bytes` starts with the gzip magic (1f 8b).
bool IsGzip(const std::vector<uint8_t>& bytes);

// Inflates every gzip member of `compressed` (as `cat a.gz b.gz` makes). Errors name `path` and
// the compressed-byte offset (corrupt or truncated data, garbage after the last member).
absl::StatusOr<std::vector<uint8_t>> Gunzip(const std::string& path,
                                            const std::vector<uint8_t>& compressed);

// Gunzip(bytes) if IsGzip(bytes), else `bytes` unchanged.
absl::StatusOr<std::vector<uint8_t>> MaybeGunzip(const std::string& path,
                                                 std::vector<uint8_t> bytes);

}  // namespace stoker

#endif  // STOKER_DATA_FILE_BYTES_H_
