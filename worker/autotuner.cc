#include "worker/autotuner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stoker {

int AutoLoaderLimit(int cpu_count) {
  // Like tf.data's AUTOTUNE, bounded by the cores: two loaders per core (a loader often waits on
  // I/O or sleeps), at least 2, at most 16.
  return std::clamp(2 * cpu_count, 2, 16);
}

int AutotuneLoaderCount(int current, int limit, double input_bound_fraction,
                        double loader_busy_per_second) {
  // Busy loader-seconds per second and loader: above this, loaders are what the trainer waits on.
  constexpr double kBottleneckBusy = 0.6;
  if (input_bound_fraction > 0.10) {
    if (current > 0 && loader_busy_per_second > kBottleneckBusy * current) {
      return std::max(current, std::min(limit, 2 * current));
    }
    return current;
  }
  const int half = current / 2;
  if (input_bound_fraction < 0.02 && half >= 1 && loader_busy_per_second <= 0.5 * half) {
    return half;
  }
  return current;
}

Autotuner::Autotuner(JobRegion& region, int limit, absl::Time now)
    : region_(region), limit_(limit), window_(WindowAt(now)) {}

Autotuner::Window Autotuner::WindowAt(absl::Time now) const {
  const JobStats& stats = region_.stats();
  return Window{now, stats.data_stall_ns_total.load(), stats.device_busy_ns_total.load(),
                stats.loader_busy_ns_total.load()};
}

std::optional<std::string> Autotuner::Tick(absl::Time now) {
  if (pending_change_ && region_.ActiveLoaderCount() == region_.RequestedLoaderCount()) {
    // The trainer appended the era: the change is in effect from its first batch.
    std::string line = absl::StrCat(*pending_change_, " from batch ", region_.ActiveEraStart());
    pending_change_.reset();
    window_ = WindowAt(now);  // measure the new count from here
    return line;
  }
  if (pending_change_ || now - window_.start < kWindow) return std::nullopt;
  const Window current = WindowAt(now);
  const uint64_t stall = current.stall_ns - window_.stall_ns;
  const uint64_t busy = current.busy_ns - window_.busy_ns;
  const uint64_t loader_busy = current.loader_ns - window_.loader_ns;
  const double window_ns = absl::ToDoubleNanoseconds(current.start - window_.start);
  const int active = static_cast<int>(region_.ActiveLoaderCount());
  if (busy > 0) {
    const double fraction = double(stall) / double(stall + busy);
    const int wanted =
        AutotuneLoaderCount(active, limit_, fraction, double(loader_busy) / window_ns);
    // The trainer appends the era at its next release (JobRegion::RequestLoaderCount); the
    // supervisor starts the loaders it needs once it is in the table.
    if (wanted != active &&
        region_.stats().consumer_next_batch.load() + region_.geometry().slot_count <
            region_.geometry().total_batches &&
        region_.RequestLoaderCount(static_cast<uint32_t>(wanted)).ok()) {
      pending_change_ =
          absl::StrCat("autotune: input-bound ", static_cast<int>(100 * fraction + 0.5),
                       "% of the last window, loaders busy ",
                       static_cast<int>(100 * double(loader_busy) / window_ns / active + 0.5),
                       "% each; loader processes ", active, " -> ", wanted);
    }
  }
  window_ = current;
  return std::nullopt;
}

}  // namespace stoker
