// The pipeline heartbeat (JobStats::heartbeats_total) for phases that work inside one long call.
#ifndef STOKER_WORKER_DATA_HEARTBEAT_H_
#define STOKER_WORKER_DATA_HEARTBEAT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace stoker {

// Raises `beats` every `period` while it lives, from a thread of its own: for a phase that does
// work in one call that can take long (loading a dataset, starting a device, writing a
// checkpoint). A stopped or killed process stops this thread with it, so the agent's watchdog
// still notices; a phase wedged inside the call does not stop it, so it is for bounded work only.
class ScopedHeartbeat {
 public:
  explicit ScopedHeartbeat(std::atomic<uint64_t>& beats,
                           std::chrono::milliseconds period = std::chrono::milliseconds(500))
      : beats_(beats), thread_([this, period] {
          std::unique_lock<std::mutex> lock(mu_);
          do {
            beats_.fetch_add(1, std::memory_order_relaxed);
          } while (!done_cv_.wait_for(lock, period, [this] { return done_; }));
        }) {}
  ~ScopedHeartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  ScopedHeartbeat(const ScopedHeartbeat&) = delete;
  ScopedHeartbeat& operator=(const ScopedHeartbeat&) = delete;

 private:
  std::atomic<uint64_t>& beats_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;   // guarded by mu_
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace stoker

#endif  // STOKER_WORKER_DATA_HEARTBEAT_H_
