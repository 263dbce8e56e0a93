// Child processes for the agent: fork+exec with chosen file descriptors inherited, output to a
// log file, and reaping. Safe in a multithreaded parent: between fork and exec the child only
// makes async-signal-safe calls.
#ifndef STOKER_WORKER_PROCESS_H_
#define STOKER_WORKER_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stoker {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the executable path
  std::vector<int> inherit_fds;   // kept open (close-on-exec cleared) in the child
  std::string log_path;           // stdout and stderr appended here ("" = inherit)
  // "NAME=VALUE" entries added to the inherited environment for names it does not set (so the
  // worker's own environment overrides them).
  std::vector<std::string> default_env;
};

// Starts the process; INTERNAL if fork fails. An exec failure shows up as exit code 127.
absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

struct ExitInfo {
  bool signaled = false;
  int code = 0;                  // exit code, or the signal number when signaled
  std::string Describe() const;  // "exit code 2", "killed by signal 9 (Killed)"
};

// Non-blocking reap of `pid`; nullopt while it runs.
std::optional<ExitInfo> TryReap(pid_t pid);
// Sends SIGTERM, waits up to `grace`, then SIGKILL; reaps and returns how it ended.
ExitInfo Terminate(pid_t pid, absl::Duration grace);

// Last `max_bytes` of a file, trimmed to whole lines (for error messages from a child's log).
std::string TailOfFile(const std::string& path, size_t max_bytes);

}  // namespace stoker

#endif  // STOKER_WORKER_PROCESS_H_
