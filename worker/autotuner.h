// `loader.processes: auto`: how many loader processes a job runs, decided every couple of seconds
// from the job's shared counters. The rules are two pure functions (AutoLoaderLimit,
// AutotuneLoaderCount); the Autotuner class applies them to a running job's region, one window at
// a time, and says what it changed so the supervisor can log it. It never starts or stops a
// process itself: it asks the trainer for a new loader era (JobRegion::RequestLoaderCount), and
// the supervisor's LoaderPool starts whichever loaders then owe batches.
#ifndef STOKER_WORKER_AUTOTUNER_H_
#define STOKER_WORKER_AUTOTUNER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "data/job_region.h"

namespace stoker {

// Most loader processes `loader.processes: auto` may grow to on a machine with `cpu_count` cores.
int AutoLoaderLimit(int cpu_count);

// `loader.processes: auto`: the next loader count, or `current` to keep it, from what the last
// window measured: the input-bound fraction (time the trainer waited for data / (waited +
// computed)) and the loaders' busy time per second of wall time (1.0 = one loader always busy).
// Doubles while the trainer waits more than 10% of the time and the loaders are the bottleneck
// (each busy more than 60% of the window), up to `limit`: when they idle while the trainer waits,
// the stall is not theirs (a loader starting up, a stopped process) and more cannot help. Halves
// when the trainer waited less than 2% of the time and half the loaders would still be at most
// 50% busy, so the cores go back to the trainer; the gap between the rules keeps it from
// oscillating.
int AutotuneLoaderCount(int current, int limit, double input_bound_fraction,
                        double loader_busy_per_second);

// Drives AutotuneLoaderCount for one attempt. Not thread-safe: the supervisor's loop calls Tick.
class Autotuner {
 public:
  // How long each measurement window lasts.
  static constexpr absl::Duration kWindow = absl::Seconds(2);

  // `region` must outlive the tuner; `limit` is the most loaders it may ask for (at most the
  // region's geometry().loader_count). The first window starts at `now`.
  Autotuner(JobRegion& region, int limit, absl::Time now);

  // One step of the supervisor's loop, at time `now`. When a change asked for earlier is in
  // effect (the trainer appended its era), returns the line to log ("autotune: input-bound N% of
  // the last window, loaders busy M% each; loader processes A -> B from batch S") and starts a new
  // window. Otherwise, once a window of kWindow has passed with the trainer computing at all, asks
  // for AutotuneLoaderCount's answer when it differs and the job has more than a ring of batches
  // left, then starts a new window. Nothing is asked while a change is pending.
  std::optional<std::string> Tick(absl::Time now);

  // A change asked for and not yet in effect.
  bool pending() const { return pending_change_.has_value(); }

 private:
  struct Window {
    absl::Time start;
    uint64_t stall_ns = 0, busy_ns = 0, loader_ns = 0;
  };
  Window WindowAt(absl::Time now) const;

  JobRegion& region_;
  const int limit_;
  Window window_;
  // What to log once the pending change is in effect.
  std::optional<std::string> pending_change_;
};

}  // namespace stoker

#endif  // STOKER_WORKER_AUTOTUNER_H_
