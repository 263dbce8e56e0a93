// Shared by the pipeline benchmarks (pipeline_bench.cc, image_pipeline_bench.cc): their clock, and
// stoker-loader processes started on a job region as the agent starts them (fork + exec, the
// region's fd inherited).
#ifndef STOKER_BENCH_PIPELINE_PIPELINE_UTIL_H_
#define STOKER_BENCH_PIPELINE_PIPELINE_UTIL_H_

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/job_region.h"

namespace stoker::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Starts the region's loader_count loaders: `loader` --region-fd FD --index K, then `args`, then
// --parent-pid (this process). A child that cannot exec exits 127 (120: the fd not inheritable).
// INTERNAL "fork failed" at the first fork that fails.
inline absl::StatusOr<std::vector<pid_t>> SpawnLoaders(const JobRegion& region,
                                                       const std::string& loader,
                                                       const std::vector<std::string>& args) {
  std::vector<pid_t> pids;
  const std::string parent = std::to_string(getpid());
  for (uint32_t k = 0; k < region.geometry().loader_count; ++k) {
    std::vector<std::string> words = {loader, "--region-fd", std::to_string(region.fd()), "--index",
                                      std::to_string(k)};
    words.insert(words.end(), args.begin(), args.end());
    words.insert(words.end(), {"--parent-pid", parent});
    std::vector<char*> argv;
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      if (!ClearCloexec(region.fd()).ok()) _exit(120);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (pid < 0) return absl::InternalError("fork failed");
    pids.push_back(pid);
  }
  return pids;
}

}  // namespace stoker::bench

#endif  // STOKER_BENCH_PIPELINE_PIPELINE_UTIL_H_
