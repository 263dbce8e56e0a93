#include "data/index/beneath.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stoker {

absl::StatusOr<std::string> RealRoot(const std::string& root) {
  char resolved[PATH_MAX];
  if (realpath(root.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(absl::StrCat(root, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(root, ": not a directory"));
  }
  return std::string(resolved);
}

bool IsBeneath(absl::string_view real_path, absl::string_view real_root) {
  if (real_root == "/") return absl::StartsWith(real_path, "/");
  if (!absl::StartsWith(real_path, real_root)) return false;
  return real_path.size() == real_root.size() || real_path[real_root.size()] == '/';
}

absl::StatusOr<std::string> PathOfDescriptor(int fd) {
  char link[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[PATH_MAX];
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) {
    return absl::InternalError(absl::StrCat("cannot read ", link, ": ", std::strerror(errno)));
  }
  return std::string(target, static_cast<size_t>(n));
}

absl::StatusOr<int> OpenBeneath(const std::string& path, const std::string& real_root,
                                int extra_flags) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  if (real_root.empty()) return fd;
  absl::StatusOr<std::string> opened = PathOfDescriptor(fd);
  if (!opened.ok() || !IsBeneath(*opened, real_root)) {
    close(fd);
    if (!opened.ok()) return opened.status();
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": leads outside the data root (a symbolic link); not read"));
  }
  return fd;
}

bool ResolvesBeneath(const std::string& path, const std::string& real_root) {
  if (real_root.empty()) return true;
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return false;
  return IsBeneath(resolved, real_root);
}

}  // namespace stoker
