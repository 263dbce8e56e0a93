// What agent.cc and agent_jobs.cc share; not for other users.
#ifndef STOKER_WORKER_AGENT_INTERNAL_H_
#define STOKER_WORKER_AGENT_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <iostream>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace stoker::agent_internal {

// One line on the worker's stderr, stamped with the local time.
inline void Log(const std::string& message) {
  std::cerr << absl::FormatTime("%H:%M:%S ", absl::Now(), absl::LocalTimeZone())
            << "stoker-worker: " << message << std::endl;
}

inline bool IsUnreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// The server answered but could not store an upload (a full disk): the file is kept and sent
// again later.
inline bool IsStorageFailure(const absl::Status& status) {
  return absl::IsResourceExhausted(status) || absl::IsInternal(status);
}

inline std::mt19937_64& Random() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  return random;
}

// Delays between retries: `first`, doubling up to `most`, each drawn from [d/2, d] so that the
// workers of a restarted server do not all call at the same moment.
class Backoff {
 public:
  Backoff(absl::Duration first, absl::Duration most) : first_(first), most_(most), next_(first) {}
  absl::Duration Next() {
    const absl::Duration d = next_;
    next_ = std::min(next_ * 2, most_);
    return d * std::uniform_real_distribution<double>(0.5, 1.0)(Random());
  }
  void Reset() { next_ = first_; }

 private:
  const absl::Duration first_, most_;
  absl::Duration next_;
};

// Sleeps `d` in small steps, returning early once `stop` is set.
inline void SleepUnlessStopped(absl::Duration d, const std::atomic<bool>& stop) {
  const absl::Time until = absl::Now() + d;
  while (!stop.load() && absl::Now() < until) {
    absl::SleepFor(std::min(absl::Milliseconds(20), until - absl::Now()));
  }
}

}  // namespace stoker::agent_internal

#endif  // STOKER_WORKER_AGENT_INTERNAL_H_
