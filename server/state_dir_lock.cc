#include "server/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stoker {

StateDirLock::StateDirLock(StateDirLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

StateDirLock& StateDirLock::operator=(StateDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<StateDirLock> LockStateDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create state directory '", dir, "': ", error.message()));
  }
  const std::string lock_path = dir + "/server.lock";
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (fd >= 0) close(fd);
    std::string holder;
    std::ifstream(lock_path) >> holder;
    return absl::FailedPreconditionError(
        absl::StrCat("state directory '", dir, "' is in use by another stoker-server",
                     holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"),
                     "; stop it or pass another --state-dir"));
  }
  StateDirLock lock(fd);
  if (ftruncate(fd, 0) == 0) {
    const std::string pid = absl::StrCat(getpid(), "\n");
    (void)!write(fd, pid.data(), pid.size());
  }
  return lock;
}

}  // namespace stoker
