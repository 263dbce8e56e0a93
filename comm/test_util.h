// Helpers of the comm tests: ranks as threads of the test, ranks as forked processes.
#ifndef STOKER_COMM_TEST_UTIL_H_
#define STOKER_COMM_TEST_UTIL_H_

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace stoker::comm_testing {

// A new directory under the temporary directory ("" when it cannot be made).
inline std::string MakeTempDirectory() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "stoker-comm-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

// Runs `body(rank)` on `size` threads and waits for all.
template <typename F>
void OnRanks(int size, F body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back([&body, rank] { body(rank); });
  for (std::thread& thread : threads) thread.join();
}

// A forked rank: the child runs `body`, exits with its result and never returns to the test.
template <typename F>
pid_t ForkRank(F body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

// The exit code of `pid`, or -signal when a signal ended it.
inline int WaitFor(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1000;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -WTERMSIG(status);
}

// As WaitFor, but a child still running after `seconds` is killed with SIGKILL and -1001 returned
// (a hang fails the test instead of hanging it).
inline int WaitForWithin(pid_t pid, double seconds) {
  for (int waited_ms = 0; waited_ms < seconds * 1000; waited_ms += 10) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (done < 0) return -1000;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1001;
}

}  // namespace stoker::comm_testing

#endif  // STOKER_COMM_TEST_UTIL_H_
