// The pipeline heartbeat (JobStats::heartbeats_total) for phases that work inside one long call.
#ifndef STOKER_DATA_HEARTBEAT_H_
#define STOKER_DATA_HEARTBEAT_H_

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stoker {

// Raises `beats` every `period` while it lives, from a thread of its own: for a phase that does
// work in one call that can take long (loading a dataset, starting a device, writing a
// checkpoint). A stopped or killed process stops this thread with it, so the agent's watchdog
// still notices; a phase wedged inside the call does not stop it, so it is for bounded work only.
class ScopedHeartbeat {
 public:
  explicit ScopedHeartbeat(std::atomic<uint64_t>& beats,
                           absl::Duration period = absl::Milliseconds(500))
      : beats_(beats), thread_([this, period] {
          absl::MutexLock lock(&mu_);
          do {
            beats_.fetch_add(1, std::memory_order_relaxed);
          } while (!mu_.AwaitWithTimeout(absl::Condition(&done_), period));
        }) {}
  ~ScopedHeartbeat() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }
  ScopedHeartbeat(const ScopedHeartbeat&) = delete;
  ScopedHeartbeat& operator=(const ScopedHeartbeat&) = delete;

 private:
  std::atomic<uint64_t>& beats_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace stoker

#endif  // STOKER_DATA_HEARTBEAT_H_
