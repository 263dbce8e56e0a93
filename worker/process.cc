#include "worker/process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace stoker {

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  // Everything the child needs is prepared before fork: no allocation after it.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const std::string& entry : options.default_env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    if (getenv(entry.substr(0, eq).c_str()) == nullptr) {
      envp.push_back(const_cast<char*>(entry.c_str()));
    }
  }
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot open log '", options.log_path, "': ", strerror(errno)));
    }
  }
  const pid_t pid = fork();
  if (pid < 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // A process group of its own: a Ctrl-C in the agent's terminal goes to the agent, which
    // drains its jobs (checkpoint, then stop), instead of killing trainers mid-step.
    setpgid(0, 0);
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    for (int fd : options.inherit_fds) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  return pid;
}

std::string ExitInfo::Describe() const {
  if (signaled) return absl::StrCat("killed by signal ", code, " (", strsignal(code), ")");
  if (code == 127) return "exit code 127 (the executable could not be started)";
  return absl::StrCat("exit code ", code);
}

namespace {
ExitInfo FromWaitStatus(int status) {
  ExitInfo info;
  if (WIFSIGNALED(status)) {
    info.signaled = true;
    info.code = WTERMSIG(status);
  } else {
    info.code = WEXITSTATUS(status);
  }
  return info;
}
}  // namespace

std::optional<ExitInfo> TryReap(pid_t pid) {
  int status = 0;
  const pid_t result = waitpid(pid, &status, WNOHANG);
  if (result == pid) return FromWaitStatus(status);
  if (result < 0 && errno == ECHILD) return ExitInfo{true, SIGKILL};  // already gone
  return std::nullopt;
}

ExitInfo Terminate(pid_t pid, absl::Duration grace) {
  if (std::optional<ExitInfo> done = TryReap(pid)) return *done;
  kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (std::optional<ExitInfo> done = TryReap(pid)) return *done;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return FromWaitStatus(status);
}

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - max_bytes : 0;
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (start > 0) {
    const size_t newline = text.find('\n');
    if (newline != std::string::npos) text.erase(0, newline + 1);
  }
  return std::string(absl::StripTrailingAsciiWhitespace(text));
}

}  // namespace stoker
