// Keeping a job's files beneath the data root when the files are opened, not only when their
// paths are checked: an image folder or a shard can hold symbolic links, and a link (or a
// directory swapped for one after the index was built) must not let a job read files outside the
// root. Symbolic links that stay beneath the root work as before.
//
// The check is on what was actually opened: the descriptor's path as the kernel resolved it
// (/proc/self/fd), compared with the root's real path, so no rename or link swap between a check
// and the open can get around it.
#ifndef STOKER_DATA_INDEX_BENEATH_H_
#define STOKER_DATA_INDEX_BENEATH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

// The real path of the directory `root` (symbolic links resolved): what the other functions take
// as `real_root`. NOT_FOUND, or INVALID_ARGUMENT when it is not a directory.
absl::StatusOr<std::string> RealRoot(const std::string& root);

// True when `real_path` (a real path: absolute, no symbolic links, no . or ..) is `real_root` or
// lies beneath it.
bool IsBeneath(absl::string_view real_path, absl::string_view real_root);

// The real path of an open descriptor (what /proc/self/fd/N names); INTERNAL when it cannot be
// read.
absl::StatusOr<std::string> PathOfDescriptor(int fd);

// Opens `path` (O_RDONLY | O_CLOEXEC | `extra_flags`), following symbolic links, and returns the
// descriptor only when the file it opened lies beneath `real_root` (empty: anywhere).
// PERMISSION_DENIED naming `path` as given (never where it led) when it does not; NOT_FOUND when it
// cannot be opened.
absl::StatusOr<int> OpenBeneath(const std::string& path, const std::string& real_root,
                                int extra_flags = 0);

// Whether `path` resolves (symbolic links followed) beneath `real_root` (empty: always true); false
// also when it does not resolve at all.
bool ResolvesBeneath(const std::string& path, const std::string& real_root);

}  // namespace stoker

#endif  // STOKER_DATA_INDEX_BENEATH_H_
