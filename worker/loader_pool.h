// The stoker-loader processes of one job attempt, as the supervisor (JobRunner) keeps them: loader
// k is started with the region's fd, the job file and the prepared training set (which every
// loader maps read-only: one copy of the data for all of them), logs to <dir>/loader-k.log, is
// reaped when it ends, and is started again when it failed, up to a restart budget for the whole
// attempt. Which loaders should run follows the region's loader eras (JobRegion::LoaderNeeded),
// so the pool also starts every loader that owes a batch and is not running.
#ifndef STOKER_WORKER_LOADER_POOL_H_
#define STOKER_WORKER_LOADER_POOL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "data/job_region.h"

namespace stoker {

struct LoaderPoolOptions {
  std::string loader_path;  // the stoker-loader executable
  std::string job_file;     // binary JobSpec with absolute dataset paths (--job)
  std::string data_file;    // the training set prepared for the attempt (--data)
  std::string dir;          // the attempt's directory: loader-<k>.log go here
  int max_restarts = 20;    // respawns of failed loaders, all loaders together
  // Data-parallel jobs: the rank the loaders feed, of `replicas` (--rank/--replicas; passed only
  // when replicas > 1).
  int rank = 0;
  int replicas = 1;
  // The worker's JPEG cache (--jpeg-cache-dir/--jpeg-cache-bytes; passed only when set).
  std::string jpeg_cache_dir;
  int64_t jpeg_cache_bytes = 0;
};

// Where loader k of the attempt in `dir` logs: <dir>/loader-<k>.log.
std::string LoaderLogPath(const std::string& dir, int k);

// Not thread-safe: one supervisor thread drives it. Errors end the attempt: INVALID_ARGUMENT when a
// loader refused the job's data (exit code 2; the message is the tail of its log, so retrying
// cannot help), INTERNAL when a loader could not be started or failed more often than the budget
// allows (the message says which and why).
class LoaderPool {
 public:
  // `region` must outlive the pool; slots for geometry().loader_count loaders. `log` receives the
  // lines the pool has to say (a respawn) and must not call back into the pool.
  LoaderPool(JobRegion& region, LoaderPoolOptions options,
             std::function<void(const std::string&)> log);
  // Terminates the loaders still running (TerminateAll with 1 s of grace).
  ~LoaderPool();
  LoaderPool(const LoaderPool&) = delete;
  LoaderPool& operator=(const LoaderPool&) = delete;

  // Starts the loaders of the first era (0 .. ActiveLoaderCount() - 1); stops at the first that
  // cannot be started.
  absl::Status StartInitial();
  // Reaps the loaders that ended. One that finished its batches (exit 0) stays stopped; one that
  // failed is respawned (restart counted in JobStats::loader_restarts_total, logged as "loader k
  // <how it ended>; respawned (restart n)") while the budget lasts. Stops at the first error.
  absl::Status ReapAndRespawn();
  // Starts every loader that owes a batch (JobRegion::LoaderNeeded) and is not running: one of a
  // new era, or one that left an era and is given batches again by a later one. Call after
  // ReapAndRespawn, so a loader that ended just now is seen as not running.
  absl::Status StartNeeded();
  // The pid of loader k while it runs.
  std::optional<pid_t> pid(int k) const { return loaders_[k]; }
  // Stops every running loader (SIGTERM, then SIGKILL after `grace`) and reaps it.
  void TerminateAll(absl::Duration grace);

 private:
  absl::Status Start(int k);
  std::string LogPath(int k) const;

  JobRegion& region_;
  const LoaderPoolOptions options_;
  std::function<void(const std::string&)> log_;
  std::vector<std::optional<pid_t>> loaders_;
  int restarts_ = 0;
};

}  // namespace stoker

#endif  // STOKER_WORKER_LOADER_POOL_H_
