// One stoker-server per state directory: two servers on the same job store would both schedule
// the same queue. LockStateDir takes an exclusive flock on <dir>/server.lock and writes the
// holder's pid into it, so that a second server can name the one that is in its way.
#ifndef STOKER_SERVER_STATE_DIR_LOCK_H_
#define STOKER_SERVER_STATE_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace stoker {

// Held while the object lives (and by nothing else: the descriptor is close-on-exec). Move-only.
class StateDirLock {
 public:
  StateDirLock(StateDirLock&& other) noexcept;
  StateDirLock& operator=(StateDirLock&& other) noexcept;
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  ~StateDirLock();

 private:
  friend absl::StatusOr<StateDirLock> LockStateDir(const std::string& dir);
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Creates `dir` if needed and locks it for this process. INTERNAL when the directory cannot be
// created ("cannot create state directory '<dir>': ..."); FAILED_PRECONDITION when another
// process holds it ("state directory '<dir>' is in use by another stoker-server (pid N); ...").
absl::StatusOr<StateDirLock> LockStateDir(const std::string& dir);

}  // namespace stoker

#endif  // STOKER_SERVER_STATE_DIR_LOCK_H_
